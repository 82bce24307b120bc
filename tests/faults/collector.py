"""The session's record of the fault suite: one entry per case, rewritten to a JSON file after each case
(so a session cut short still leaves what it did), with the totals `make faults` prints.

The file is FLEET_FAULTS_SUMMARY when set, else `faults-summary.json` under pytest's basetemp.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SUMMARY_ENV = "FLEET_FAULTS_SUMMARY"
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
# Findings that must all be 0 (they are also the case's own assertions).
MUST_BE_ZERO = ("leaked", "duplicates", "not_terminal", "secret_hits")


def summarize(records: list[dict[str, Any]]) -> dict[str, int]:
    """The totals over the recorded cases. A case that shows a known product bug (a strict xfail that
    failed) is counted apart, in `known_broken`, and not in the rest: it proved no recovery."""
    cases = [c for c in records if not c.get("known_broken")]
    totals = {
        "cases": len(cases),
        "faults_injected": sum(c["faults_injected"] for c in cases),
        "runs_completed": sum(1 for c in cases for s in c["runs"].values() if s.split()[0] in TERMINAL),
    }
    for name in MUST_BE_ZERO:
        totals[name] = sum(len(c["findings"][name]) for c in cases)
    totals["cases_failed"] = sum(1 for c in cases if not c["passed"])
    totals["known_broken"] = len(records) - len(cases)
    return totals


class Collector:
    """Collects the cases' records and keeps the summary file up to date."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.cases: list[dict[str, Any]] = []
        path.parent.mkdir(parents=True, exist_ok=True)

    def add(self, record: dict[str, Any]) -> None:
        self.cases.append(record)
        body = {"summary": summarize(self.cases), "cases": self.cases}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(body, indent=1) + "\n")
        tmp.replace(self.path)
