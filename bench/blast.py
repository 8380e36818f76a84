"""What the blast radius adds to a run: the per-range classification of the same ledgers with and
without it, measured in the same run (the I/O of a range, metadata reads and agent calls, is the same
either way: the blast radius comes from the answers the checks already have).

    python -m bench.blast --ledgers 100000
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from bench.common import table
from bench.scale import BOOKIES, bookie, rack_of, synthetic_ledgers
from scrutiny.checks import BookieAnswer, Outcome, expected_share
from scrutiny.codec import Availability
from scrutiny.config import ScanSettings
from scrutiny.scan.classify import classify
from scrutiny.scan.context import Pass, RunContext


def run(ledgers: int, repeats: int = 3) -> list[dict[str, Any]]:
    mds = list(synthetic_ledgers(ledgers, 1000))
    answers: dict[str, dict[int, BookieAnswer]] = {}
    for md in mds:
        for b in md.bookies:
            answers.setdefault(b, {})[md.ledger_id] = BookieAnswer(Outcome.ENTRIES,
                                                                   Availability.of(expected_share(md, b)))
    settings = ScanSettings(metadata_service_uri="zk://127.0.0.1:1/ledgers", placement_policy="none")
    racks = {bookie(n): rack_of(n) for n in range(BOOKIES)}
    rows = []
    base = 0.0
    for blast in (False, True):
        ctx = RunContext(settings, racks, {}, {}, 0, blast_radius=blast)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            result = classify(ctx, Pass.FIRST, mds, answers)
            times.append(time.perf_counter() - t0)
        median = statistics.median(times)
        base = base or median
        rows.append({"classification": "with blast radius" if blast else "checks only (baseline)",
                     "ledgers": ledgers, "seconds (median)": round(median, 2),
                     "us per ledger": round(median / ledgers * 1e6, 1), "x baseline": round(median / base, 2),
                     "bookies and racks counted": len(result.blast)})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ledgers", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    print(table(run(args.ledgers, args.repeats)))


if __name__ == "__main__":
    main()
