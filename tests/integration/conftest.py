"""What the end-to-end tests share: a fleet home of their own, cleaned up (and checked) afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.fleetproc import cleanup


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    """An empty FLEET_HOME for one test; afterwards its Redis is stopped and no local head may be left."""
    home = tmp_path / "fleet"
    home.mkdir()
    yield home
    left = cleanup(home)
    assert left == [], f"local heads left running: {left}"
