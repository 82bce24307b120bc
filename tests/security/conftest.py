"""The security tests that run a live fleet use the fault suite's `case` (its invariant checker scans for
canary secrets); the fixtures and the report hook come from there. Those that drive the bot share the
integration tests' fake Discord (Discord's rate limits on)."""

from tests.faults.conftest import case, collector, pytest_runtest_makereport
from tests.integration.conftest import fake_discord

__all__ = ["case", "collector", "fake_discord", "pytest_runtest_makereport"]
