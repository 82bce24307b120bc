"""`python -m tests.faults.summary FILE`: the fault suite's totals as ONE JSON object on the last line;
exit 1 when no case ran, a case failed, or any of leaked / duplicates / not_terminal / secret_hits is not 0.
Cases that show a known product bug (strict xfails) are listed on stderr and counted in `known_broken`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.faults.collector import MUST_BE_ZERO, summarize


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.faults.summary SUMMARY.json", file=sys.stderr)
        return 2
    path = Path(argv[0])
    try:
        cases = json.loads(path.read_text())["cases"]
    except (OSError, ValueError, KeyError) as exc:
        print(f"no fault summary at {path}: {exc}", file=sys.stderr)
        print(json.dumps({"cases": 0, "error": "no summary"}))
        return 1
    totals = summarize(cases)
    for case in cases:
        if case.get("known_broken"):
            print(f"KNOWN BROKEN {case['case']}: {case['known_broken']}", file=sys.stderr)
        elif not case["passed"]:
            found = {k: v for k, v in case["findings"].items() if v}
            print(f"FAILED {case['case']}: {json.dumps(found)}", file=sys.stderr)
    print(json.dumps(totals))
    bad = totals["cases"] == 0 or totals["cases_failed"] or any(totals[k] for k in MUST_BE_ZERO)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
