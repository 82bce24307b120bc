"""One composition root: settings, secrets and providers are built in providers/world.py, and every process
(the CLI, the bot, the service, the workers) gets them from a World.

The rule is read from the code: outside world.py, no module of the fleet calls what builds them (the
loaders of settings and secrets, a ProviderContext, the registry's provider makers, a provider class),
except where each is defined."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
import redis
from typer.testing import CliRunner

from core.errors import ConfigError
from core.settings import Settings
from providers.registry import PROVIDERS
from providers.sealed import SealedStore
from providers.world import World
from service.runs import Fleet
from tests.unit.test_layers import LAYERS, ROOT

REGISTRY = "providers/registry.py"
BUILDERS = {
    "load_settings": ("core/settings.py",),
    "load_secrets": ("core/secrets.py", REGISTRY),
    "load_fleet_secrets": (REGISTRY,),
    "get_provider": (REGISTRY,),
    "configured_providers": (REGISTRY,),
    "ProviderContext": ("providers/base.py",),
    **{cls.__name__: (REGISTRY,) for cls in PROVIDERS.values()},
}
"""What builds the world, and the modules besides world.py that may call it: where it is defined, and the
registry, which reads the fleet's credentials and makes the providers world.py asks for."""

ROOT_MODULE = "providers/world.py"


def builder_calls(root: Path = ROOT) -> list[str]:
    """`path:line: name` for every call of a builder outside world.py and the builder's own module."""
    found = []
    for package in LAYERS:
        for path in sorted((root / package).rglob("*.py")):
            where = path.relative_to(root).as_posix()
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=where)
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
                if name in BUILDERS and where != ROOT_MODULE and where not in BUILDERS[name]:
                    found.append(f"{where}:{node.lineno}: {name}")
    return found


def test_the_world_is_built_in_one_place() -> None:
    assert builder_calls() == []


def test_the_rule_finds_a_world_built_elsewhere(tmp_path: Path) -> None:
    """The scan sees a builder called outside world.py (a copy of the fleet with one such module)."""
    for package in LAYERS:
        (tmp_path / package).mkdir()
    (tmp_path / "service" / "sneaky.py").write_text(
        "from providers.registry import load_fleet_secrets, get_provider\n"
        "def f(settings):\n"
        "    secrets = load_fleet_secrets()\n"
        "    return registry.get_provider('runpod', secrets), RunPodProvider(None)\n"
    )
    (tmp_path / "providers" / "world.py").write_text("def w():\n    return load_fleet_secrets()\n")
    assert builder_calls(tmp_path) == [
        "service/sneaky.py:3: load_fleet_secrets",
        "service/sneaky.py:4: get_provider",
        "service/sneaky.py:4: RunPodProvider",
    ]


def secrets_file(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_a_world_reads_its_secrets_once_on_first_use(tmp_path: Path) -> None:
    path = secrets_file(tmp_path / "secrets.yml", "RUNPOD_API_KEY: first\n")
    world = World(Settings(home=tmp_path), env={"FLEET_SECRETS_FILE": str(path)})
    assert world.context.credential("RUNPOD_API_KEY").get_secret_value() == "first"
    secrets_file(path, "RUNPOD_API_KEY: second\n")
    assert world.secrets.get("RUNPOD_API_KEY").get_secret_value() == "first"  # type: ignore[union-attr]
    assert world.provider("runpod") is world.provider("runpod")  # made once
    fresh = World(Settings(home=tmp_path), env={"FLEET_SECRETS_FILE": str(path)})
    assert fresh.secrets.get("RUNPOD_API_KEY").get_secret_value() == "second"  # type: ignore[union-attr]


def test_a_world_that_needs_no_secret_never_reads_the_file(tmp_path: Path) -> None:
    broken = secrets_file(tmp_path / "secrets.yml", "NOT_A_CREDENTIAL: x\n")
    env = {"FLEET_SECRETS_FILE": str(broken), "FLEET_SETTINGS_FILE": os.devnull, "FLEET_HOME": str(tmp_path)}
    world = World.load(env)
    assert world.settings.home == tmp_path
    with pytest.raises(ConfigError, match="NOT_A_CREDENTIAL"):
        _ = world.secrets


def test_a_sharing_world_keeps_its_secrets_and_seals_the_nodes_tokens_in_redis(
    tmp_path: Path, redis_client: redis.Redis[str]
) -> None:
    path = secrets_file(tmp_path / "secrets.yml", "RUNPOD_API_KEY: mine\n")
    alone = World(Settings(home=tmp_path), env={"FLEET_SECRETS_FILE": str(path)})
    assert alone.context.node_secrets is None or not isinstance(alone.context.node_secrets, SealedStore)
    shared = alone.sharing(redis_client)
    secrets_file(path, "RUNPOD_API_KEY: changed\n")
    assert shared.secrets is alone.secrets  # what the process started with, not read again
    assert isinstance(shared.context.node_secrets, SealedStore)


def test_a_fleet_connected_from_a_world_is_that_world_not_another(tmp_path: Path, redis_url: str) -> None:
    """`fleet submit` loads its world to validate the job, then connects: the connection keeps the secrets
    and settings it checked the job against (read once), not a second world read again."""
    path = secrets_file(tmp_path / "secrets.yml", "RUNPOD_API_KEY: mine\n")
    env = {"FLEET_SECRETS_FILE": str(path), "FLEET_SETTINGS_FILE": os.devnull, "FLEET_HOME": str(tmp_path)}
    world = World.load({**env, "REDIS_URL": redis_url})
    assert world.secrets.get("RUNPOD_API_KEY").get_secret_value() == "mine"  # type: ignore[union-attr]
    secrets_file(path, "RUNPOD_API_KEY: changed\n")
    fleet = Fleet.connect(world)
    assert fleet.settings is world.settings and fleet.world.secrets is world.secrets
    assert isinstance(fleet.world.context.node_secrets, SealedStore)  # shares through the fleet's Redis


def test_seal_key_reads_the_fleets_secrets_file_whatever_else_it_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fleet seal-key` on a machine whose secrets file also holds the clouds' keys (it read the file
    knowing only FLEET_SEAL_KEY, and refused RUNPOD_API_KEY as unknown)."""
    from fleet.cli import cli

    path = secrets_file(tmp_path / "secrets.yml", "RUNPOD_API_KEY: rp\n")
    monkeypatch.setenv("FLEET_SECRETS_FILE", str(path))
    monkeypatch.setenv("FLEET_SETTINGS_FILE", os.devnull)
    monkeypatch.setenv("FLEET_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("FLEET_SEAL_KEY", raising=False)
    result = CliRunner().invoke(cli, ["seal-key"])
    assert result.exit_code == 0, result.output
    made = (tmp_path / "home").rglob("*")
    assert any(made), "the key was not made in the home"
