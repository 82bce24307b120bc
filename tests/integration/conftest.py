"""What the integration tests share: a fleet home of their own, cleaned up (and checked) afterwards; the
environment of a CLI on the session's Redis; the fake Discord; a real Ray head for a module."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import discord.http
import pytest
import redis

from providers.base import NodeEndpoint
from providers.local.client import HeadMeta, LocalHeads
from providers.node import jobs_api_answers
from tests.fakes import FakeDiscord
from tests.integration.clouds import API_KEY, VAST_KEY, serving
from tests.integration.fleetproc import cleanup


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    """An empty FLEET_HOME for one test; afterwards its Redis is stopped and no local head may be left."""
    home = tmp_path / "fleet"
    home.mkdir()
    yield home
    left = cleanup(home)
    assert left == [], f"local heads left running: {left}"


@pytest.fixture
def env(redis_client: redis.Redis[str], redis_url: str, fleet_home: Path) -> dict[str, str]:
    """The environment of a fleet CLI on the session's Redis (emptied) with a home and no settings file."""
    settings = fleet_home / "settings.yml"
    settings.write_text("{}\n")
    return {"REDIS_URL": redis_url, "FLEET_HOME": str(fleet_home), "FLEET_SETTINGS_FILE": str(settings)}


# Discord's per-channel and per-webhook limits (5 requests per 5 s), 50 times faster, on for every test of the
# bot and the notifier: each must stay within them (discord.py waits as the X-RateLimit headers say).
DISCORD_LIMITS = {
    op: (5, 0.1) for op in ("create_message", "edit_message", "execute_webhook", "edit_webhook_message")
}


@pytest.fixture
def fake_discord(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDiscord]:
    """A running fake Discord (its DEFAULT_TOKEN is the bot's), with discord.py's `Route.BASE` pointed at it,
    and Discord's rate limits on: a test whose client went over them fails at its end. `Route.BASE` is
    process-global: monkeypatch restores it for every later test."""
    with FakeDiscord(rate_limits=DISCORD_LIMITS) as running:
        monkeypatch.setattr(discord.http.Route, "BASE", f"{running.url}/api/v10")
        yield running
        assert running.state()["over_limit"] == 0, "a client went over Discord's rate limits"


@pytest.fixture
def fake_runpod(tmp_path: Path) -> Iterator[str]:
    with serving("runpod", tmp_path / "fake", API_KEY) as url:
        yield url


@pytest.fixture
def fake_vastai(tmp_path: Path) -> Iterator[str]:
    with serving("vastai", tmp_path / "fake", VAST_KEY) as url:
        yield url


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HeadMeta, NodeEndpoint]]:
    """One real Ray head (token auth) for the module, and how the fleet reaches it."""
    heads = LocalHeads(tmp_path_factory.mktemp("head") / "nodes")
    meta = heads.start("module-head", 1, 0, {})
    endpoint = NodeEndpoint(
        meta.dashboard_url, meta.dashboard_url, {"Authorization": f"Bearer {heads.token(meta.name)}"}
    )
    try:
        deadline = time.monotonic() + 120
        while not jobs_api_answers(meta.dashboard_url, endpoint.headers):
            assert time.monotonic() < deadline, f"the head did not come up: {heads.log_tail(meta.name)}"
            time.sleep(0.5)
        yield meta, endpoint
        if not heads.head_alive(meta):  # shown with a failing test's output: why the head went
            print(f"the module's head died; its log ends:\n{heads.log_tail(meta.name, 20)}")
            print(ray_logs_tail(Path(meta.temp_dir)))
    finally:
        heads.stop(meta.name)


def ray_logs_tail(temp_dir: Path, lines: int = 8) -> str:
    """The last warnings and errors of each log of a Ray head's latest session (raylet, GCS, dashboard...)."""
    logs = temp_dir / "session_latest" / "logs"
    tails = []
    for path in sorted(logs.glob("*.err")) + sorted(logs.glob("*.out")) + sorted(logs.glob("dashboard*.log")):
        said = [
            line
            for line in path.read_text(errors="replace").splitlines()
            if any(word in line for word in ("ERROR", "WARN", "FATAL", "died", "xited", "health"))
            and "Deprecation" not in line
        ]
        if said:
            tails.append(f"--- {path.name}\n" + "\n".join(said[-lines:]))
    return "\n".join(tails) or f"no warnings in the Ray logs under {logs}"
