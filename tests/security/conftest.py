"""The security tests that run a live fleet use the fault suite's `case` (its invariant checker scans for
canary secrets); the fixtures and the report hook come from there."""

from tests.faults.conftest import case, collector, pytest_runtest_makereport

__all__ = ["case", "collector", "pytest_runtest_makereport"]
