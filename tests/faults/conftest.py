"""The fault suite's fixtures: the session's collector, and `case`, which checks the invariants after each
case, records it, and only then stops what the case started.

Markers: every case is `faults`; the long ones (full training runs) are also `faults_full`, which
`pytest -q` leaves out (pyproject's addopts) and `make faults` (`-m faults`) runs.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests.faults.case import Case
from tests.faults.collector import SUMMARY_ENV, Collector

REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None]:
    """Keep each phase's report on the item, for `case` to know whether the test body passed."""
    report: pytest.TestReport = yield
    item.stash.setdefault(REPORTS, {})[report.when] = report
    return report  # type: ignore[return-value]


@pytest.fixture(scope="session")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Collector:
    explicit = os.environ.get(SUMMARY_ENV)
    path = Path(explicit) if explicit else tmp_path_factory.getbasetemp() / "faults-summary.json"
    return Collector(path.resolve())


@pytest.fixture
def case(request: pytest.FixtureRequest, collector: Collector) -> Iterator[Case]:
    """The case record. Afterwards: the invariant check (if the test did not run it; with short waits
    when the test failed, only to record where things stood), the record, then the case's cleanup."""
    record = Case(request.node.nodeid)
    with record.stack:
        yield record
        body = request.node.stash.get(REPORTS, {}).get("call")
        passed = body is not None and body.passed
        known_broken = getattr(body, "wasxfail", None)  # a strict xfail that failed as it says
        try:
            if record.findings is None:
                if not passed:
                    record.end_timeout_s, record.settle_s = 5.0, 5.0
                from tests.faults.invariants import check

                record.findings = check(record)
        finally:
            for sampler in record.samplers:
                sampler.stop()
            collector.add(record.record(passed, known_broken))
        if passed:
            assert record.findings.clean(), f"invariants broken: {record.findings.as_dict()}"
