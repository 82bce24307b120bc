"""Issue 19, finding 12d: who may stop a run from Discord, and who sees the fleet's answers.

A run's owner (who started it with /train or /sweep) or an admin (by user or role) may cancel it or
terminate its node; any other allowlisted user is refused privately and nothing happens. A run started by
the CLI or the git trigger has no Discord owner: only admins may stop it from Discord. /status, /runs,
/logs and /instances answer the caller alone unless they pass `public: true`.

Through discord.py's own dispatch against the fake Discord and real Redis (tests/integration/test_bot.py's
harness); the fake records each answer's flags, and a followup's visibility as Discord decides it (the
first one after a deferral is as private as the deferral).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from core.policy_settings import Source
from core.settings import Settings
from jobs.spec import parse_job
from providers.world import World
from service.runs import Fleet, submit
from state.models import Instance, InstanceState
from state.payloads import EventType
from tests.fakes import FakeDiscord
from tests.integration.test_bot import (
    ALLOWED_ROLE,
    ALLOWED_USER,
    CHANNEL,
    CONFIGS,
    EPHEMERAL,
    STRANGER,
    TINY,
    Harness,
    run_bot,
)

pytestmark = pytest.mark.integration

ADMIN_ROLE = 730000000000000001
ADMIN_USER = 710000000000000007
MEMBER: dict[str, Any] = {"user": STRANGER, "roles": (ALLOWED_ROLE,)}  # allowlisted, owns nothing
ADMIN: dict[str, Any] = {"user": ADMIN_USER, "roles": (ALLOWED_ROLE, ADMIN_ROLE)}
JOB = {"config": "tiny-lora.yml"}  # a named config (its datasets beside it)


@pytest.fixture
def fleet(
    fake_discord: FakeDiscord,
    redis_url: str,
    redis_client: redis.Redis[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Fleet]:
    monkeypatch.setenv("FLEET_SECRETS_FILE", str(tmp_path / "missing.yml"))
    (tmp_path / "home").mkdir()
    settings = Settings(
        redis_url=redis_url,
        home=tmp_path / "home",
        discord_api_base=f"{fake_discord.url}/api/v10",
        discord_allowed_users=(ALLOWED_USER,),
        discord_allowed_roles=(ALLOWED_ROLE,),
        discord_allowed_channels=(CHANNEL,),
        discord_admin_roles=(ADMIN_ROLE,),
        bot_configs_dir=CONFIGS,
        local_jobs_from=(Source.CLI, Source.DISCORD),  # the configs it submits are local jobs
    )
    connected = Fleet.connect(World.of(settings))
    yield connected
    connected.redis.close()


def _answer(record: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    """(whether only the caller sees it, the first answer) as Discord shows it."""
    callback = record["callbacks"][0]
    if callback["type"] == 5:
        first = record["followups"][0]
        return first["ephemeral"], first["data"]
    return bool(int(callback["data"].get("flags") or 0) & EPHEMERAL), callback["data"]


async def _train(h: Harness, **caller: Any) -> str:
    """A run started with /train (by `caller`, by default the allowlisted user): its id."""
    _private, data = _answer(await h.invoke("train", JOB, **caller))
    title = data["embeds"][0]["title"]
    assert title.startswith("Run ") and title.endswith(" queued"), data
    return str(title.split(" ")[1])


def _audit(client: redis.Redis[str], kind: EventType) -> list[dict[str, Any]]:
    found = [json.loads(f["event"]) for _sid, f in client.xrange("tf:events")]
    return [e["data"] for e in found if e["type"] == kind.value]


def test_only_the_owner_or_an_admin_may_cancel_a_run(
    fleet: Fleet, fake_discord: FakeDiscord, redis_client: redis.Redis[str]
) -> None:
    from_cli = submit(fleet, parse_job(TINY, source="cli.yml", base_dir=CONFIGS))

    async def scenario(h: Harness) -> None:
        mine, other = await _train(h), await _train(h)
        # Someone else's run, and a run from the CLI: refused privately, nothing changed.
        for run_id, why in ((mine, "started by another user"), (from_cli.run_id, "not started from Discord")):
            private, data = _answer(await h.invoke("cancel", {"run": run_id}, **MEMBER))
            assert private and data["embeds"][0]["title"] == "Not your run", data
            assert why in data["embeds"][0]["description"]
            assert not fleet.ledger.get_run(run_id).cancel_requested
        private, data = _answer(await h.invoke("cancel", {"run": from_cli.run_id}))  # an allowlisted user
        assert private and "only a fleet admin" in data["embeds"][0]["description"]
        # Its owner may; an admin may cancel anyone's, the CLI's too.
        _private, data = _answer(await h.invoke("cancel", {"run": mine}))
        assert data["embeds"][0]["title"] == f"Cancelling {mine}"
        for run_id in (other, from_cli.run_id):
            _private, data = _answer(await h.invoke("cancel", {"run": run_id}, **ADMIN))
            assert data["embeds"][0]["title"] == f"Cancelling {run_id}"

    run_bot(fleet, fake_discord, scenario)
    assert all(r.cancel_requested for r in fleet.ledger.list_runs())
    done = [(c["user_id"], c["command"]) for c in _audit(redis_client, EventType.BOT_COMMAND)]
    assert done.count((str(ALLOWED_USER), "cancel")) == 1 and done.count((str(ADMIN_USER), "cancel")) == 2
    refused = [r for r in _audit(redis_client, EventType.BOT_REFUSED) if r["kind"] == "owner"]
    assert [r["user_id"] for r in refused] == [str(STRANGER), str(STRANGER), str(ALLOWED_USER)]


def test_only_the_owner_or_an_admin_may_terminate_a_runs_node_and_the_answer_is_private(
    fleet: Fleet, fake_discord: FakeDiscord, redis_client: redis.Redis[str]
) -> None:
    async def scenario(h: Harness) -> None:
        run = fleet.ledger.get_run(await _train(h))
        name = run.instance_name
        fleet.ledger.put_instance(
            Instance(name=name, provider="local", run_id=run.run_id, state=InstanceState.RUNNING)
        )
        record = await h.invoke("terminate", {"instance": name, "force": True}, **MEMBER)
        private, data = _answer(record)
        assert (
            record["callbacks"][0]["type"] == 4 and private and data["embeds"][0]["title"] == "Not your run"
        )
        instance = fleet.ledger.get_instance(name)
        assert instance is not None and instance.state == InstanceState.RUNNING  # untouched
        # An instance of no run we know: admins only.
        private, data = _answer(await h.invoke("terminate", {"instance": "tf-orphan-1"}))
        assert private and "not started from Discord" in data["embeds"][0]["description"]
        # The owner, and an admin, get as far as the provider (the node is not live here); whatever the
        # terminate says stays private: the deferral was private.
        for caller in ({}, ADMIN):
            for instance_name in (name, "tf-orphan-1") if caller else (name,):
                record = await h.invoke("terminate", {"instance": instance_name}, **caller)
                private, data = _answer(record)
                assert record["callbacks"][0]["type"] == 5 and private, (caller, instance_name)
                assert "no live instance" in data["embeds"][0]["description"]

    run_bot(fleet, fake_discord, scenario)
    refused = [r for r in _audit(redis_client, EventType.BOT_REFUSED) if r["kind"] == "owner"]
    assert [(r["user_id"], r["command"]) for r in refused] == [
        (str(STRANGER), "terminate"),
        (str(ALLOWED_USER), "terminate"),
    ]


@pytest.mark.parametrize(
    ("command", "options"),
    [("status", {}), ("status", {"run": "RUN"}), ("runs", {}), ("logs", {"run": "RUN"}), ("instances", {})],
)
def test_status_answers_are_private_unless_asked_to_be_public(
    fleet: Fleet, fake_discord: FakeDiscord, command: str, options: dict[str, Any]
) -> None:
    async def scenario(h: Harness) -> None:
        run = fleet.ledger.get_run(await _train(h))
        given = {k: run.run_id if v == "RUN" else v for k, v in options.items()}
        private, data = _answer(await h.invoke(command, given))
        assert private and data["embeds"][0]["title"], data
        private, data = _answer(await h.invoke(command, {**given, "public": True}, **MEMBER))
        assert not private and data["embeds"][0]["title"], data

    run_bot(fleet, fake_discord, scenario)
