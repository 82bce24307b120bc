"""docker-compose.yml: what it runs is the real `fleet` CLI, each stage queue has one worker service, Redis
keeps an append-only file, and no credential is written in it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from broker.queues import QUEUES
from fleet.cli import cli
from providers.registry import CREDENTIAL_NAMES

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"
REFERENCE = re.compile(r"^\$\{[A-Z_][A-Z0-9_]*(:?-[^}]*)?\}$")  # ${VAR} or ${VAR:-default}
BARE = re.compile(r"^\$\{[A-Z_][A-Z0-9_]*(:?-)?\}$")  # ${VAR} or ${VAR:-}


def services() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))["services"]
    return found


def fleet_commands() -> dict[str, list[str]]:
    """Each service's `fleet` arguments (without the leading `fleet`), by service name; redis has none."""
    return {name: svc["command"][1:] for name, svc in services().items() if name != "redis"}


def test_redis_keeps_an_append_only_file_and_every_fleet_service_waits_for_it() -> None:
    redis = services()["redis"]
    command = redis["command"]
    assert command[0] == "redis-server" and command[command.index("--appendonly") + 1] == "yes"
    assert redis["healthcheck"]["test"] and any(v.endswith(":/data") for v in redis["volumes"])
    for name, svc in services().items():
        assert svc["restart"] == "unless-stopped", name
        if name != "redis":
            assert svc["depends_on"]["redis"]["condition"] == "service_healthy", name
            assert svc["environment"]["REDIS_URL"] == "redis://redis:6379/0", name


def test_every_queue_has_exactly_one_worker_service() -> None:
    consumed: dict[str, list[str]] = {}
    for name, args in fleet_commands().items():
        if args[0] == "worker":
            queues = args[args.index("-Q") + 1].split(",")
            for queue in queues:
                consumed.setdefault(queue, []).append(name)
    assert consumed == {queue: [f"worker-{queue}"] for queue in QUEUES}


def test_beat_flower_bot_and_notifier_run_their_fleet_commands() -> None:
    commands = fleet_commands()
    assert [n for n, args in commands.items() if args[0] == "beat"] == ["beat"]  # exactly one beat
    assert commands["flower"][0] == "flower" and "0.0.0.0" in commands["flower"]
    assert "FLOWER_BASIC_AUTH" in services()["flower"]["environment"]
    assert commands["bot"] == ["bot"] and commands["notifier"] == ["notify"]
    # Only the notifier posts the events (a bot with a channel would post them a second time).
    assert "FLEET_DISCORD_CHANNEL_ID" not in services()["bot"]["environment"]


@pytest.mark.parametrize("service", sorted(fleet_commands()))
def test_each_command_is_accepted_by_the_real_cli(service: str) -> None:
    """Click rejects an unknown option even with --help, so a wrong flag fails here."""
    args = fleet_commands()[service]
    assert services()[service]["command"][0] == "fleet"
    result = CliRunner().invoke(cli, [*args, "--help"])
    assert result.exit_code == 0, (args, result.output)


def test_every_fleet_service_but_the_bot_has_a_healthcheck_the_real_cli_accepts() -> None:
    """`fleet health PART` (tests/integration/test_health.py and test_notifier.py run it against real
    processes); the bot has none yet (its health is its gateway session, which the fake Discord lacks)."""
    for name, svc in services().items():
        if name in ("redis", "bot"):
            continue
        test = svc["healthcheck"]["test"]
        assert test[:3] == ["CMD", "fleet", "health"], (name, test)
        assert test[3] == ("worker" if name.startswith("worker-") else name), (name, test)
        result = CliRunner().invoke(cli, [*test[2:], "--help"])
        assert result.exit_code == 0, (name, result.output)
    flower = services()["flower"]["command"]
    assert flower[flower.index("--host") + 1] == "127.0.0.1:5555"  # the name its healthcheck reaches it by


def test_no_credential_is_written_in_the_file() -> None:
    """A credential is passed through from the host by name (null) or as a bare ${VAR}, never with a value
    or a non-empty default; every other value given by reference is a plain ${VAR[:-default]}."""
    for name, svc in services().items():
        for key, value in (svc.get("environment") or {}).items():
            if key in CREDENTIAL_NAMES or any(
                word in key for word in ("TOKEN", "KEY", "AUTH", "WEBHOOK", "PASS")
            ):
                assert value is None or BARE.match(str(value)), (name, key)
            elif isinstance(value, str) and "$" in value:
                assert REFERENCE.match(value), (name, key)
    # Every credential the fleet knows reaches the services that need it, by name.
    env = services()["worker-provision"]["environment"]
    assert {k for k in CREDENTIAL_NAMES if k != "FLEET_DISCORD_BOT_TOKEN"} <= set(env)


def test_the_containers_refuse_local_jobs_and_have_git() -> None:
    """A local Ray head in one worker's container is out of the other stages' reach: the compose fleet's
    settings (as the real Settings read them) leave local out, so such a job is refused at submit. The image
    has git, for `fleet watch` and `enqueue --changed-since`."""
    from core.settings import Settings

    for name, svc in services().items():
        if name == "redis":
            continue
        allowed = Settings.model_validate({"providers": svc["environment"]["FLEET_PROVIDERS"]}).providers
        assert allowed == ("runpod", "vastai", "ssh"), name  # ssh: the pools mounted into every service
    dockerfile = (COMPOSE.parent / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"apt-get install -y --no-install-recommends git\b", dockerfile)
