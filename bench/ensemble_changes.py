"""A range's checks (`classify`) over the scale benchmark's synthetic ledgers, 5% of which had an ensemble change,
with every answer encoded as a real agent encodes it (BP-34's encoder over the entries held: `codec.encode`), not
as the synthetic store writes it: every ledger, and the ledgers whose ensemble changed alone. CPU of this process,
the best of --repeats. Run it in two trees, alternately, to compare them.

    python -m bench.ensemble_changes --ledgers 50000
"""

from __future__ import annotations

import argparse
import gc
import time

from bench.common import as_columns, table
from bench.scale import BOOKIES, bookie, rack_of, synthetic_ledgers
from scrutiny.checks import BookieAnswers, expected_share
from scrutiny.codec import Availability, encode
from scrutiny.config import ScanSettings
from scrutiny.metadata import LedgerMetadata
from scrutiny.scan.classify import classify
from scrutiny.scan.context import Pass, RunContext
from scrutiny.scan.work import YOUNG_COLLECTION_THRESHOLD


def run(count: int, repeats: int = 5) -> list[dict[str, object]]:
    mds = list(synthetic_ledgers(count, 1000))
    answers: dict[str, BookieAnswers] = {}
    encoded: dict[tuple[int, ...], bytes] = {}
    for md in mds:
        for b in md.bookies:
            ids = Availability.of(expected_share(md, b)).entry_ids()
            key = tuple(ids.tolist())
            answers.setdefault(b, BookieAnswers(b)).encoded[md.ledger_id] = encoded.get(key) or encoded.setdefault(
                key, encode(ids))
    as_columns(answers)
    ctx = RunContext(ScanSettings(metadata_service_uri="zk+hierarchical://127.0.0.1:2181/ledgers"),
                     {bookie(n): rack_of(n) for n in range(BOOKIES)}, {}, {}, 10**13, blast_radius=True)
    young, *older = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, *older)  # as an executor runs

    def best(ledgers: list[LedgerMetadata]) -> float:
        times = []
        for _ in range(repeats):
            t0 = time.process_time()
            result = classify(ctx, Pass.FIRST, ledgers, answers)
            times.append(time.process_time() - t0)
            assert not result.violations and not result.potentially_faulty
        return min(times) / len(ledgers) * 1e6

    try:
        changed = [md for md in mds if len(md.segments) > 1]
        return [{"ledgers": "every one", "count": len(mds), "classify us each": best(mds)},
                {"ledgers": "those whose ensemble changed", "count": len(changed), "classify us each": best(changed)}]
    finally:
        gc.set_threshold(young, *older)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ledgers", type=int, default=50_000)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    print(table(run(a.ledgers, a.repeats)))


if __name__ == "__main__":
    main()
