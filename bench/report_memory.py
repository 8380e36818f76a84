"""What a driver holds for a run with many findings: the findings themselves, and writing the report.
The report written a finding at a time (`Report.write_json`, what the CLI and the report files do)
against the whole document made first (`json.dumps(report.to_json(), indent=2)`, what they did), in
the same run; Python heap measured by tracemalloc, per finding.

    python -m bench.report_memory --findings 1000000
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import tracemalloc
from pathlib import Path

from bench.common import table
from scrutiny.categories import Category
from scrutiny.checks import Violation
from scrutiny.findings import Findings
from scrutiny.pulsar.owners import Owner
from scrutiny.report import Report

BOOKIES = [f"bookie-{n}.bk.svc:3181" for n in range(30)]


def findings(n: int) -> list[Violation]:
    """Findings as a lost rack leaves them: one bookie missing from each ledger's write sets."""
    out = []
    for lid in range(n):
        bookie = BOOKIES[lid % len(BOOKIES)]
        details = {"ack_quorum": 2, "ensemble_size": 3, "write_quorum": 2, "least_copies": 1, "lost_bookies": [bookie],
                   "under_covered": [{"copies": 1, "entries": 34, "first_entry": 0, "last_entry": 99,
                                      "missing_bookies": [bookie], "sequence_period": 3, "sequence_size": 1}]}
        out.append(Violation(Category.LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY, lid, (bookie,), details, 3,
                             owner=Owner("topic", f"persistent://public/default/t-{lid % 5000}")))
    return out


def measure(n: int, streamed: bool, directory: Path) -> dict[str, object]:
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    report = Report("r", "s", "f", True, {"checked": n}, Findings(findings(n)))
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.reset_peak()
    t0 = time.perf_counter()
    path = directory / f"report-{streamed}.json"
    with path.open("w") as out:
        if streamed:
            report.write_json(out)
        else:
            out.write(json.dumps(report.to_json(), indent=2))
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    assert len(json.loads(path.read_text())["violations"]) == n
    return {"findings": n, "written": "a finding at a time" if streamed else "whole document",
            "held, bytes/finding": held / n, "peak while writing, bytes/finding": peak / n,
            "peak MB": peak / 2**20, "write s": seconds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--findings", type=int, default=1_000_000)
    p.add_argument("--baseline-findings", type=int, default=200_000,
                   help="the whole-document baseline (it needs about 6 KB a finding)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(args.baseline_findings, False, Path(tmp)), measure(args.baseline_findings, True, Path(tmp)),
                measure(args.findings, True, Path(tmp))]
    print(table(rows))


if __name__ == "__main__":
    main()
