"""The bot's slash commands through discord.py's own dispatch, against real Redis and the fake Discord.

Each interaction is a payload shaped like Discord's INTERACTION_CREATE, handed to the client's
`ConnectionState.parse_interaction_create` (what the gateway does), so discord.py builds the real
`Interaction`, the `CommandTree` routes it (access check first), and every answer reaches the fake as an
HTTP request (callback, followup). No command function is called directly.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import discord
import discord.http
import pytest
import redis

from bot.app import FleetBot
from bot.render import separate_message
from broker import sweeps as sweep_slots
from core.errors import ConfigError
from core.policy_settings import Source
from core.settings import Settings
from jobs.spec import format_problems, parse_job
from providers.base import LaunchRequest
from providers.registry import FleetSettings
from providers.world import World
from service.runs import Fleet
from state import nodelogs
from state.models import Instance, InstanceState, Run
from state.payloads import Event, EventType
from state.stages import RunState
from tests.fakes import FakeDiscord
from tests.fakes.discord import DEFAULT_TOKEN
from tests.integration.fleetproc import Worker, events_of, fleet_env, wait_for_end, wait_until
from tests.integration.fleetproc import fleet as run_fleet

TOKEN = DEFAULT_TOKEN
GUILD, CHANNEL, OTHER_CHANNEL = 700000000000000001, 700000000000000002, 700000000000000003
ALLOWED_USER, ALLOWED_ROLE = 710000000000000001, 720000000000000001
STRANGER, OTHER_ROLE = 710000000000000009, 720000000000000009
REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs" / "examples"
TINY = (CONFIGS / "tiny-lora.yml").read_bytes()
EPHEMERAL = 64
CANARY = "canary-secret-value-77ab3c"

# Valid options for every command, so a refusal can only come from the access check.
OPTIONS: dict[str, dict[str, Any]] = {
    "train": {"file": ("tiny-lora.yml", TINY)},
    "sweep": {"file": ("tiny-lora.yml", TINY), "sweep_file": ("sweep.yml", b"lora_r: [4, 8]\n")},
    "status": {"run": "nope"},
    "runs": {},
    "logs": {"run": "nope"},
    "cancel": {"run": "nope"},
    "instances": {},
    "terminate": {"instance": "tf-nope-1"},
    "budget": {},
    "jupyter": {"run": "nope"},
}


@pytest.fixture
def settings(
    fake_discord: FakeDiscord, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    monkeypatch.setenv("FLEET_SECRETS_FILE", str(tmp_path / "missing.yml"))
    home = tmp_path / "home"
    home.mkdir()
    return FleetSettings(
        redis_url=redis_url,
        home=home,
        discord_api_base=f"{fake_discord.url}/api/v10",
        discord_allowed_users=(ALLOWED_USER,),
        discord_allowed_roles=(ALLOWED_ROLE,),
        discord_allowed_channels=(CHANNEL,),
        bot_configs_dir=CONFIGS,
        data_roots=(CONFIGS / "data",),  # an attachment's local files must be under a data root
        local_jobs_from=(Source.CLI, Source.DISCORD),  # the tiny config trains on this machine
    )


Scenario = Callable[["Harness"], Awaitable[None]]


class Harness:
    """A logged-in FleetBot (REST only, no gateway) and a way to send it interactions."""

    def __init__(self, bot: FleetBot, fake_discord: FakeDiscord) -> None:
        self.bot, self.fake_discord = bot, fake_discord

    async def invoke(
        self,
        command: str,
        options: dict[str, Any] | None = None,
        *,
        user: int = ALLOWED_USER,
        roles: tuple[int, ...] = (),
        channel: int = CHANNEL,
        guild: int | None = GUILD,
        focused: str | None = None,
    ) -> dict[str, Any]:
        """Deliver one interaction as the gateway would; returns what the fake recorded for it."""
        payload = self.fake_discord.interaction_payload(
            command,
            options,
            user_id=user,
            role_ids=roles,
            channel_id=channel,
            guild_id=guild,
            focused=focused,
        )
        self.bot._connection.parse_interaction_create(payload)  # type: ignore[arg-type]
        running = [t for t in asyncio.all_tasks() if t.get_name() == "CommandTree-invoker"]
        await asyncio.gather(*running)
        record: dict[str, Any] = self.fake_discord.state()["interactions"][payload["id"]]
        return record


def run_bot(fleet: Fleet, fake_discord: FakeDiscord, scenario: Scenario) -> None:
    async def main() -> None:
        bot = FleetBot(fleet)
        await bot.login(TOKEN)
        try:
            await scenario(Harness(bot, fake_discord))
        finally:
            await bot.close()

    asyncio.run(main())


@pytest.fixture
def fleet(settings: Settings, redis_client: redis.Redis[str]) -> Iterator[Fleet]:
    connected = Fleet.connect(World.of(settings))
    yield connected
    connected.redis.close()


def _reply(record: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """(callback type, the first answer: the callback's data, or the first followup's after a defer)."""
    callback = record["callbacks"][0]
    if callback["type"] == 5:
        return 5, record["followups"][0]["data"]
    return callback["type"], callback["data"]


def _audit(client: redis.Redis[str], kind: EventType) -> list[dict[str, Any]]:
    found = [json.loads(f["event"]) for _sid, f in client.xrange("tf:events")]
    return [e["data"] for e in found if e["type"] == kind.value]


def _queued(client: redis.Redis[str]) -> int:
    """Messages waiting on the provision queue (Celery's Redis list)."""
    return int(client.llen("provision"))


def test_every_command_and_autocomplete_refuses_strangers(
    fleet: Fleet, fake_discord: FakeDiscord, redis_client: redis.Redis[str]
) -> None:
    callers: dict[str, dict[str, Any]] = {
        "unlisted user": {"user": STRANGER},
        "unlisted role": {"user": STRANGER, "roles": (OTHER_ROLE,)},
        "wrong channel": {"channel": OTHER_CHANNEL},
        "dm": {"guild": None},
    }
    seen: list[tuple[str, str, str]] = []

    async def scenario(h: Harness) -> None:
        commands = {c.name: c for c in h.bot.tree.get_commands()}
        assert set(commands) == set(OPTIONS), "every command needs options here"
        for name, command in commands.items():
            assert isinstance(command, discord.app_commands.Command)
            focusable = [p.name for p in command.parameters if p.autocomplete]
            for who, caller in callers.items():
                record = await h.invoke(name, OPTIONS[name], **caller)
                ((kind, data),) = [(c["type"], c["data"]) for c in record["callbacks"]]
                assert kind == 4 and data["flags"] & EPHEMERAL, (name, who)
                assert data["embeds"][0]["title"] == "Refused", (name, who)
                assert record["followups"] == []
                seen.append((name, "command", who))
                for option in focusable:
                    record = await h.invoke(name, {**OPTIONS[name], option: ""}, focused=option, **caller)
                    assert record["callbacks"] == [{"type": 8, "data": {"choices": []}}], (name, option, who)
                    seen.append((name, "autocomplete", who))
        # The allowed: a listed user, and an unlisted user with a listed role, in the fleet's channel.
        for caller in ({"user": ALLOWED_USER}, {"user": STRANGER, "roles": (ALLOWED_ROLE,)}):
            kind, data = _reply(await h.invoke("runs", **caller))
            assert kind == 4 and data["embeds"][0]["title"] == "Runs"
            record = await h.invoke("status", {"run": ""}, focused="run", **caller)
            assert record["callbacks"][0]["type"] == 8

    run_bot(fleet, fake_discord, scenario)
    assert fleet.ledger.list_runs() == [] and _queued(redis_client) == 0
    refused = _audit(redis_client, EventType.BOT_REFUSED)
    assert len(refused) == len(seen) >= len(OPTIONS) * 4 + 4 * 4  # /status /logs /cancel /terminate + /train
    assert [(r["command"], r["kind"]) for r in refused] == [(name, kind) for name, kind, _who in seen]
    assert {r["reason"].split(" ")[0] for r in refused} == {"the", "you"}
    assert {r["user_id"] for r in refused} == {str(STRANGER), str(ALLOWED_USER)}


def test_train_attachment_validates_and_enqueues(
    fleet: Fleet, fake_discord: FakeDiscord, redis_client: redis.Redis[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_API_KEY", CANARY)  # a known credential: never shown, even back to its owner
    bad = TINY.replace(b"lora_r: 8", b"lora_r: eight").replace(b"micro_batch_size: 8", b"micro_batch_size: 0")
    try:
        parse_job(bad, source="bad.yml", base_dir=CONFIGS)
    except ConfigError as exc:
        expected = format_problems(exc)
    assert "lora_r" in expected and "micro_batch_size" in expected

    async def scenario(h: Harness) -> None:
        kind, data = _reply(await h.invoke("train", {"file": ("bad.yml", bad)}))
        assert kind == 4 and data["flags"] & EPHEMERAL
        assert data["embeds"][0]["title"] == "Invalid job"
        assert data["embeds"][0]["description"] == f"```\n{expected}\n```"
        leaked = TINY.replace(b"lora_r: 8", f"lora_r: {CANARY}".encode())
        kind, data = _reply(await h.invoke("train", {"file": ("leak.yml", leaked)}))
        assert "lora_r: must be a whole number" in data["embeds"][0]["description"]
        assert "[redacted]" in data["embeds"][0]["description"]
        assert CANARY not in json.dumps(h.fake_discord.state()["interactions"])
        kind, data = _reply(await h.invoke("train", {}))
        assert (
            data["embeds"][0]["title"] == "Invalid job"
            and "either a YAML file" in data["embeds"][0]["description"]
        )
        kind, data = _reply(await h.invoke("train", {"config": "../../pyproject.toml"}))
        assert "no config named" in data["embeds"][0]["description"]
        assert fleet.ledger.list_runs() == [] and _queued(redis_client) == 0

        kind, data = _reply(await h.invoke("train", {"file": ("tiny-lora.yml", TINY)}))
        assert kind == 5 and not (data.get("flags") or 0) & EPHEMERAL
        (run,) = fleet.ledger.list_runs()
        assert data["embeds"][0]["title"] == f"Run {run.run_id} queued"
        assert run.source == "tiny-lora.yml" and run.spec.train.lora_r == 8
        assert _queued(redis_client) == 1

        record = await h.invoke("train", {"config": "tiny"}, focused="config")
        assert record["callbacks"][0]["data"]["choices"] == [  # every config whose name has it
            {"name": name, "value": name} for name in ("tiny-lora-runpod.yml", "tiny-lora.yml")
        ]
        kind, data = _reply(await h.invoke("train", {"config": "tiny-lora.yml"}, roles=(ALLOWED_ROLE,)))
        assert kind == 5 and len(fleet.ledger.list_runs()) == 2

        kind, data = _reply(await h.invoke("status", {"run": run.run_id}))
        assert data["embeds"][0]["title"].startswith(run.run_id)
        kind, data = _reply(await h.invoke("logs", {"run": run.run_id}))
        assert "run.queued" in data["embeds"][0]["description"] and not data.get("attachments")
        nodelogs.put(fleet.redis, run.run_id, f"{run.run_id}-1-fetch", "fetched trainfleet/tiny-llama\n")
        kind, data = _reply(await h.invoke("logs", {"run": run.run_id}))  # what its node printed, as a file
        assert [a["filename"] for a in data["attachments"]] == [f"node-{run.run_id}.log"]
        (sent,) = [body for name, body in fake_discord.files.values() if name == f"node-{run.run_id}.log"]
        assert sent.decode() == f"==> {run.run_id}-1-fetch <==\nfetched trainfleet/tiny-llama\n"
        record = await h.invoke("cancel", {"run": ""}, focused="run")
        assert {c["value"] for c in record["callbacks"][0]["data"]["choices"]} == {
            r.run_id for r in fleet.ledger.list_runs()
        }
        kind, data = _reply(await h.invoke("cancel", {"run": run.run_id}))
        assert data["embeds"][0]["title"] == f"Cancelling {run.run_id}"
        assert fleet.ledger.get_run(run.run_id).cancel_requested
        kind, data = _reply(await h.invoke("budget"))
        assert data["flags"] & EPHEMERAL and "**2** of 5" in data["embeds"][0]["description"]
        kind, data = _reply(await h.invoke("terminate", {"instance": "tf-nope-1"}))  # of no run: admins only
        assert kind == 4 and data["flags"] & EPHEMERAL and data["embeds"][0]["title"] == "Not your run"

    run_bot(fleet, fake_discord, scenario)
    commands = _audit(redis_client, EventType.BOT_COMMAND)
    assert [c["command"] for c in commands] == ["train", "train", "cancel"]
    assert commands[0]["user_id"] == str(ALLOWED_USER)
    assert {c["name"] for c in fake_discord.state()["commands"]["global"]} == set(OPTIONS)


def test_caps_per_user(fleet: Fleet, fake_discord: FakeDiscord, redis_client: redis.Redis[str]) -> None:
    capped = Fleet.connect(
        World.of(fleet.settings.model_copy(update={"bot_runs_per_hour": 2, "bot_dollars_per_day": 3.0}))
    )
    job = {"file": ("tiny-lora.yml", TINY)}
    other: dict[str, Any] = {"user": STRANGER, "roles": (ALLOWED_ROLE,)}

    async def scenario(h: Harness) -> None:
        for _ in range(2):
            assert _reply(await h.invoke("train", job))[0] == 5
        kind, data = _reply(await h.invoke("train", job))
        assert kind == 4 and data["flags"] & EPHEMERAL
        assert data["embeds"][0]["title"] == "Over your cap" and "2 runs in the last hour" in str(data)
        mine = {r.run_id for r in capped.ledger.list_runs()}
        # Another user is not held to the first one's count, until their runs cost more than $3 a day.
        assert _reply(await h.invoke("train", job, **other))[0] == 5
        (theirs,) = [r for r in capped.ledger.list_runs() if r.run_id not in mine]
        capped.ledger.put_instance(
            Instance(
                name=f"tf-{theirs.run_id}-1",
                provider="runpod",
                run_id=theirs.run_id,
                price_per_hour=2.0,
                state=InstanceState.RUNNING,
                created_at=time.time() - 2 * 3600,
            )
        )
        kind, data = _reply(await h.invoke("train", job, **other))
        assert data["embeds"][0]["title"] == "Over your cap" and "$4.00 in the last 24 h" in str(data)
        kind, data = _reply(await h.invoke("budget", **other))
        assert "**$4.00** of $3.00" in data["embeds"][0]["description"]

    run_bot(capped, fake_discord, scenario)
    assert len(capped.ledger.list_runs()) == 3 and _queued(redis_client) == 3
    caps = [r for r in _audit(redis_client, EventType.BOT_REFUSED) if r["kind"] == "cap"]
    assert [c["user_id"] for c in caps] == [str(ALLOWED_USER), str(STRANGER)]


def test_jupyter_shows_the_url_to_the_runs_owner_alone_and_privately(
    fleet: Fleet, fake_discord: FakeDiscord, redis_client: redis.Redis[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.fakes.runpod import FakeRunPod

    section = "runpod:\n  gpu: NVIDIA RTX A5000\n  max_bid_per_gpu: 0.5\n  one_shot: false\n  jupyter: true\n"
    # One Ray worker per GPU of the pod (jobs.topology): the example's two fit only on two GPUs.
    text = TINY.replace(b"ray_num_workers: 2\n", b"").replace(b"local:\n  one_shot: true\n", section.encode())
    job = {"file": ("lab.yml", text)}
    other: dict[str, Any] = {"user": STRANGER, "roles": (ALLOWED_ROLE,)}
    home = fleet.settings.home
    with FakeRunPod(api_key="rp-key", home=home / "fake", nodes="none", ready_delay_s=0) as fake:
        monkeypatch.setenv("RUNPOD_API_KEY", "rp-key")
        lab = Fleet.connect(
            World.of(
                fleet.settings.model_copy(update={"runpod_api_base_url": fake.url, **fake.proxy.values()})
            )
        )
        token: list[str] = []

        async def scenario(h: Harness) -> None:
            assert _reply(await h.invoke("train", job))[0] == 5
            (run,) = lab.ledger.list_runs()
            kind, data = _reply(await h.invoke("jupyter", {"run": run.run_id}))
            assert kind == 5 and data["flags"] & EPHEMERAL and "has no node" in str(data)
            # The run's pod, as provision would make it (no worker runs here).
            provider = lab.world.provider("runpod")
            provider.launch(LaunchRequest(run.instance_name, run.run_id, run.spec.section))
            lab.ledger.update_run(run.run_id, on_node)
            lab.ledger.put_instance(Instance(name=run.instance_name, provider="runpod", run_id=run.run_id))
            wait = time.monotonic() + 10
            while provider.get(run.instance_name).message == "starting":  # type: ignore[union-attr]
                assert time.monotonic() < wait, "the pod never ran"
                time.sleep(0.05)
            token.append(str(provider.tokens.jupyter(run.instance_name)))

            kind, data = _reply(await h.invoke("jupyter", {"run": run.run_id}, **other))  # not its owner
            assert kind == 4 and data["flags"] & EPHEMERAL and data["embeds"][0]["title"] == "Not your run"
            record = await h.invoke("jupyter", {"run": run.run_id})
            kind, data = _reply(record)
            # Deferred privately: Discord makes the first followup what the deferral was, whatever its flags.
            assert kind == 5 and record["callbacks"][0]["data"]["flags"] & EPHEMERAL
            assert data["flags"] & EPHEMERAL
            # Through RunPod's HTTPS proxy (here the fake's, by the same URL template): https://.../<pod>-8888/lab
            shown = data["embeds"][0]["description"]
            assert fake.proxy.url_template.split("{")[0] in shown and f"-8888/lab?token={token[0]}" in shown

        run_bot(lab, fake_discord, scenario)
        lab.redis.close()
    interactions = fake_discord.state()["interactions"].values()
    private = [i for i in interactions if token[0] in json.dumps(i)]
    assert len(private) == 1 and private[0]["followups"][0]["data"]["flags"] & EPHEMERAL
    assert [k for k in redis_client.scan_iter("*") if token[0] in json.dumps(_values(redis_client, k))] == []
    audited = [c for c in _audit(redis_client, EventType.BOT_COMMAND) if c["command"] == "jupyter"]
    assert [c["user_id"] for c in audited] == [str(ALLOWED_USER)]


def on_node(run: Run) -> list[Any]:
    run.instance = run.instance_name
    return []


def _values(client: redis.Redis[str], key: str) -> Any:
    kind = client.type(key)  # type: ignore[no-untyped-call]
    if kind == "stream":
        return client.xrange(key)
    if kind == "list":
        return client.lrange(key, 0, -1)
    if kind == "hash":
        return client.hgetall(key)
    if kind == "zset":
        return client.zrange(key, 0, -1)
    return sorted(client.smembers(key)) if kind == "set" else client.get(key)


NOTIFY_CHANNEL = 700000000000000004


def _states(message: dict[str, Any]) -> list[str]:
    """The State field of a status message, at its creation and after each edit, repeats collapsed."""
    out: list[str] = []
    for version in [message["created"], *message["edits"]]:
        state = next(f["value"] for f in version["embeds"][0]["fields"] if f["name"] == "State")
        if not out or out[-1] != state:
            out.append(state)
    return out


def test_train_from_discord_end_to_end(
    home: Path, fake_discord: FakeDiscord, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/train with the tiny config attached, a real fleet (`fleet up`: Celery workers, a local Ray head) and
    the bot's own notifier: the status message is edited through every stage to SUCCEEDED, then the result
    message follows."""
    env = fleet_env(home)
    monkeypatch.setenv("FLEET_SECRETS_FILE", env["FLEET_SECRETS_FILE"])
    fake_discord.add_channel(NOTIFY_CHANNEL)
    settings = Settings(
        home=home,
        discord_api_base=f"{fake_discord.url}/api/v10",
        discord_allowed_users=(ALLOWED_USER,),
        discord_allowed_channels=(CHANNEL,),
        discord_channel_id=NOTIFY_CHANNEL,
        bot_configs_dir=CONFIGS,
        data_roots=(CONFIGS / "data",),  # an attachment's local files must be under a data root
        local_jobs_from=(Source.CLI, Source.DISCORD),  # the tiny config trains on this machine
    )
    fleet = Fleet.connect(World.of(settings))
    worker = Worker(env, home / "worker.log")
    found: dict[str, Any] = {}

    def posted(run_id: str) -> list[dict[str, Any]]:
        """The run's messages: in its thread, started in the notifier's channel from a message naming it."""
        state = fake_discord.state()
        (thread,) = [t for t, th in state["threads"].items() if th["name"].startswith(f"{run_id} · ")] or [
            None
        ]
        if thread is None:
            return []
        assert state["threads"][thread]["parent_id"] == str(NOTIFY_CHANNEL)
        messages: list[dict[str, Any]] = state["channels"].get(thread, [])
        return [m for m in messages if run_id in json.dumps(m["created"])]

    async def scenario(h: Harness) -> None:
        # Trained in one process (use_ray: false): this test is about Discord, not Ray Train's start-up.
        light = TINY.replace(b"use_ray: true", b"use_ray: false")
        kind, data = _reply(await h.invoke("train", {"file": ("tiny-lora.yml", light)}))
        assert kind == 5, data
        (run,) = fleet.ledger.list_runs()
        found["view"] = await asyncio.to_thread(wait_for_end, env, run.run_id)
        found["messages"] = await asyncio.to_thread(
            wait_until,
            lambda: (m := posted(run.run_id)) and "succeeded" in json.dumps(m[-1]) and m,
            60,
            "the result message",
        )

    try:
        run_bot(fleet, fake_discord, scenario)
    finally:
        worker.stop()
        fleet.redis.close()
    assert found["view"]["state"] == "SUCCEEDED", found["view"]
    kinds = [e["type"] for e in events_of(home, found["view"]["run_id"])]
    assert "run.kicked" not in kinds  # the bot's task reached the worker itself, not through the reaper
    status, *others = found["messages"]
    assert _states(status) == ["QUEUED", "PROVISIONING", "PREPARING", "TRAINING", "FINALIZING", "SUCCEEDED"]
    result = others[-1]
    assert result["content"].startswith(f"✅ Run {found['view']['run_id']} succeeded: eval_loss")
    # Posted before the status message's last edit (a run's own messages go first), after its creation.
    assert result["created"]["at"] >= status["created"]["at"]
    assert not any(m["embeds"] for m in others), "one status message per run"


def test_sweep_from_discord_validates_queues_and_shows_its_table(
    fleet: Fleet, fake_discord: FakeDiscord, redis_client: redis.Redis[str]
) -> None:
    """/sweep: a bad value is named where the sweep file wrote it and nothing is queued; a good sweep queues
    one run per combination, sends only max_parallel of them, counts each against the caller's caps, and
    answers with the table. When the sweep ends, the notifier's message is that table with the best
    starred."""
    bad = b"lora_r: [4, eight]\n"

    async def scenario(h: Harness) -> None:
        options: dict[str, Any] = {"file": ("tiny-lora.yml", TINY), "sweep_file": ("s.yml", bad)}
        kind, data = _reply(await h.invoke("sweep", options))
        assert kind == 4 and data["flags"] & EPHEMERAL and data["embeds"][0]["title"] == "Invalid sweep"
        assert "s.yml:1: lora_r[1]: must be a whole number" in data["embeds"][0]["description"]
        assert fleet.ledger.list_runs() == [] and _queued(redis_client) == 0

        good = b"learning_rate: [0.01, 0.02]\nlora_r: [4, 8]\n"
        options = {"config": "tiny-lora.yml", "sweep_file": ("s.yml", good), "max_parallel": 2}
        kind, data = _reply(await h.invoke("sweep", options))
        assert kind == 5
        runs = fleet.ledger.list_runs()
        assert len(runs) == 4 and _queued(redis_client) == 2
        (sweep,) = fleet.ledger.list_sweeps()
        embed = data["embeds"][0]
        assert embed["title"] == f"🧪 Sweep {sweep.sweep_id} RUNNING · tiny-lora.yml"
        assert embed["description"].count("WAITING") == 2 and "learning_rate" in embed["description"]
        kind, data = _reply(await h.invoke("budget"))
        assert "**4** of 5" in data["embeds"][0]["description"]
        kind, data = _reply(await h.invoke("sweep", options))  # 4 more would pass the cap of 5 an hour
        refused = data["embeds"][0]
        assert refused["title"] == "Over your cap" and "counts as 4 runs" in refused["description"]
        assert len(fleet.ledger.list_runs()) == 4

    run_bot(fleet, fake_discord, scenario)
    (sweep,) = fleet.ledger.list_sweeps()
    for loss, run_id in zip([1.3, 1.1, 1.2, 1.4], sweep.runs, strict=True):

        def succeed(r: Run, loss: float = loss) -> None:
            r.state, r.metrics["eval_loss"] = RunState.SUCCEEDED, loss

        fleet.ledger.update_run(run_id, succeed)
    sweep_slots.advance(fleet.ledger, fleet.dispatcher, sweep.sweep_id)
    everything = [Event.model_validate_json(f["event"]) for _sid, f in redis_client.xrange("tf:events")]
    (finished,) = [e for e in everything if e.type == EventType.SWEEP_FINISHED]
    text = separate_message(finished)
    assert text is not None and text.startswith(f"🧪 Sweep {sweep.sweep_id} SUCCEEDED")
    (starred,) = [line for line in text.splitlines() if line.startswith("*")]
    assert sweep.runs[1] in starred and "1.1" in starred


def test_fleet_bot_starts_registers_its_commands_and_its_health_follows_its_gateway(
    tmp_path: Path, fake_discord: FakeDiscord, redis_url: str
) -> None:
    """`fleet bot` as a process: refused without its token; with one, it logs in, registers its commands in
    the configured server and connects to the gateway (the fake's), and `fleet health bot` says so; while
    Discord drops it, health fails, and passes again once it is back; after SIGTERM it fails at once. Its
    token shows up in nothing it prints."""
    env = fleet_env(tmp_path / "home", REDIS_URL=redis_url, FLEET_DISCORD_GUILD_ID=str(GUILD))
    cmd = [sys.executable, "-m", "fleet", "bot"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "FLEET_DISCORD_BOT_TOKEN is not set" in done.stderr
    assert fake_discord.state()["requests"] == {}

    def healthy() -> bool:
        return run_fleet(env, "health", "bot", timeout=60).returncode == 0

    assert not healthy()
    env.update(FLEET_DISCORD_BOT_TOKEN=TOKEN, FLEET_DISCORD_API_BASE=f"{fake_discord.url}/api/v10")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(healthy, 60, "fleet health bot to pass", every=1.0)
        registered = fake_discord.state()["commands"]
        assert list(registered) == [str(GUILD)]
        assert {c["name"] for c in registered[str(GUILD)]} == set(OPTIONS)
        gateway = fake_discord.state()["gateway"]
        assert gateway["identified"] == 1 and gateway["open"] == 1 and gateway["heartbeats"] >= 1

        fake_discord.close_gateway()  # Discord drops the bot and does not take it back for a while
        wait_until(lambda: not healthy(), 30, "fleet health bot to fail", every=1.0)
        fake_discord.open_gateway()
        wait_until(healthy, 60, "fleet health bot to pass again", every=1.0)
        assert fake_discord.state()["gateway"]["open"] == 1
    finally:
        proc.terminate()
        out, errs = proc.communicate(timeout=60)
    assert proc.returncode == 0 and not healthy(), errs[-2000:]  # a clean close, its mark taken away
    assert TOKEN not in out + errs
