"""What the integration tests share: a fleet home of their own, cleaned up (and checked) afterwards; the
fake Discord."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import discord.http
import pytest

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
def fake_discord(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDiscord]:
    """A running fake Discord (its DEFAULT_TOKEN is the bot's), with discord.py's `Route.BASE` pointed at it.
    That class attribute is process-global: monkeypatch restores it for every later test."""
    with FakeDiscord() as running:
        monkeypatch.setattr(discord.http.Route, "BASE", f"{running.url}/api/v10")
        yield running


@pytest.fixture
def fake_runpod(tmp_path: Path) -> Iterator[str]:
    with serving("runpod", tmp_path / "fake", API_KEY) as url:
        yield url


@pytest.fixture
def fake_vastai(tmp_path: Path) -> Iterator[str]:
    with serving("vastai", tmp_path / "fake", VAST_KEY) as url:
        yield url
