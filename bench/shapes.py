"""A range's checks (`classify`) as the cluster has more racks. Rack-aware ensembles on distinct racks, five bookies a
rack: a range of 10,000 ledgers has some 180 shapes (ordered locations, WQ, AQ) on 5 racks and some 6,300 on 20.
The healthy majority checked a group at a time, as a scan checks it: in an executor's first range (what each shape
shares worked out) and in a later one; and each ledger alone (the reference path); and a later range again with the
ledgers tagged as Pulsar tags a topic's, ten to a topic (each bookie's and rack's topics counted too). CPU of this
process, the best of --repeats (a first range: once). Run it in two trees, alternately, to compare them.

    python -m bench.shapes --racks 5 10 20
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import time

from bench.common import as_columns, table
from bench.scale import bookie, rack_of, synthetic_ledgers
from scrutiny.checks import BookieAnswers, expected_share
from scrutiny.codec import encode_groups
from scrutiny.config import ScanSettings
from scrutiny.metadata import LedgerMetadata
from scrutiny.pulsar import encode
from scrutiny.scan.classify import classify
from scrutiny.scan.context import Pass, RunContext
from scrutiny.scan.healthy import Shape, forget_shapes
from scrutiny.scan.work import YOUNG_COLLECTION_THRESHOLD


def run(racks: list[int], count: int = 10_000, repeats: int = 5) -> list[dict[str, object]]:
    young, *older = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, *older)  # as an executor runs
    try:
        return [_row(r, count, repeats) for r in racks]
    finally:
        gc.set_threshold(young, *older)


def _row(racks: int, count: int, repeats: int) -> dict[str, object]:
    bookies = 5 * racks
    mds = list(synthetic_ledgers(count, 1000, racks=racks, bookies=bookies))
    answers: dict[str, BookieAnswers] = {}
    for md in mds:  # as an agent encodes a share held exactly
        for b in md.bookies:
            answers.setdefault(b, BookieAnswers(b)).encoded[md.ledger_id] = encode_groups(expected_share(md, b))
    as_columns(answers)
    locations = {bookie(n): rack_of(n, racks) for n in range(bookies)}
    ctx = RunContext(ScanSettings(metadata_service_uri="zk+hierarchical://127.0.0.1:2181/ledgers"), locations,
                     {}, {}, 10**13, blast_radius=True)
    shapes: set[Shape] = {(tuple(tuple(locations[b] for b in seg.ensemble) for seg in md.segments),
                           md.write_quorum, md.ack_quorum) for md in mds}

    owned = [dataclasses.replace(md, custom_metadata=encode.ledger_keys(
        "topic", f"persistent://public/bench/topic-{md.ledger_id // 10}")) for md in mds]

    def cpu(grouped: bool, times: int, ledgers: list[LedgerMetadata] = mds) -> float:
        best = float("inf")
        for _ in range(times):
            t0 = time.process_time()
            result = classify(ctx, Pass.FIRST, ledgers, answers, grouped=grouped)
            best = min(best, time.process_time() - t0)
            assert result.counts == {"checked": count} and not result.violations
        return best / count * 1e6

    forget_shapes()
    cold = cpu(True, 1)
    warm, alone = cpu(True, repeats), cpu(False, repeats)
    return {"racks": racks, "bookies": bookies, "shapes in the range": len(shapes),
            "grouped, a first range us": cold, "grouped, a later range us": warm,
            "each ledger alone us": alone, "alone / grouped (later)": alone / warm,
            "owned by topics: grouped, a later range us": cpu(True, repeats, owned)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--racks", type=int, nargs="+", default=[5, 10, 20])
    p.add_argument("--ledgers", type=int, default=10_000, help="a range: a hierarchical bucket holds 10,000")
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    print(table(run(a.racks, a.ledgers, a.repeats)))


if __name__ == "__main__":
    main()
