"""A range's checks (`classify`): the healthy majority a group at a time against every ledger alone (the reference
path), on the same range of `bench.scale`'s synthetic cluster (30 bookies on 5 racks, E=3/WQ=2 and E=5/WQ=3,
two-segment ledgers, 1,000 entries), each bookie's answer as an agent encodes it, the ledgers Pulsar topics'.
The two paths alternate; each figure is the median of --repeats runs; both must find the same.

    python -m bench.classify [--ledgers 10000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

from bench.common import table
from bench.scale import BOOKIES, bookie, rack_of, synthetic_ledgers
from scrutiny.checks import BookieAnswers, expected_share
from scrutiny.codec import encode_groups
from scrutiny.config import ScanSettings
from scrutiny.scan.classify import classify
from scrutiny.scan.context import Pass, RunContext

URI = "zk+hierarchical://127.0.0.1:2181/ledgers"


def topic(lid: int) -> tuple[tuple[str, bytes], ...]:
    return (("application", b"pulsar"), ("component", b"managed-ledger"),
            ("pulsar/managed-ledger", b"public/default/persistent/t-%d" % (lid % 500)))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ledgers", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    mds = [dataclasses.replace(md, custom_metadata=topic(md.ledger_id))
           for md in synthetic_ledgers(args.ledgers, 1000)]
    answers: dict[str, BookieAnswers] = {}
    for md in mds:
        for b in md.bookies:
            answers.setdefault(b, BookieAnswers(b)).encoded[md.ledger_id] = encode_groups(expected_share(md, b))
    locations = {bookie(n): rack_of(n) for n in range(BOOKIES)}
    rows = []
    for blast in (True, False):
        ctx = RunContext(ScanSettings(metadata_service_uri=URI), locations, {}, {}, 10**13, blast_radius=blast)
        times: dict[bool, list[float]] = {True: [], False: []}
        results = {}
        for _ in range(args.repeats):
            for grouped in (False, True):
                t0 = time.process_time()
                results[grouped] = classify(ctx, Pass.FIRST, mds, answers, grouped=grouped)
                times[grouped].append(time.process_time() - t0)
        assert results[True] == results[False] and results[True].counts == {"checked": len(mds)}
        alone, grouped_s = statistics.median(times[False]), statistics.median(times[True])
        rows.append({"blast radius": "on" if blast else "off", "ledgers": len(mds),
                     "ledger by ledger: CPU us/ledger": alone / len(mds) * 1e6,
                     "in groups: CPU us/ledger": grouped_s / len(mds) * 1e6, "ratio": grouped_s / alone})
    print(table(rows))


if __name__ == "__main__":
    main()
