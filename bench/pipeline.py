"""An executor's CPU per ledger without I/O: metadata decoded from znode bytes, the agents' stream
messages read, the range classified (blast radius on), over the scale benchmark's synthetic ledgers.

Five ways in the same run: the baseline, every answer decoded as it arrives and every ledger checked alone;
answers kept encoded and shares compared in bulk, each ledger then checked alone; the same with the healthy
ledgers checked a group at a time (`check_healthy`); the same with the agents' EOK answers as columns
(`listed_as_columns`) rather than a sub-message each (the reference path a scan takes); and what a first pass
does, the plain ledgers read, asked about and checked in columns, never made objects (`scan.plain`). CPU time
of this process, the best of --repeats (the machine is shared and noisy; the best is the least disturbed).

Then the floor of the metadata's decoding as long as protobuf's Python objects read it: each znode's message
parsed alone, and parsed with every field a check uses read (no object of ours made), per ledger.

    python -m bench.pipeline --ledgers 20000
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from google.protobuf.internal import decoder as pb_decoder

from bench.common import table
from bench.scale import BOOKIES, bookie, rack_of, synthetic_ledgers
from scrutiny.agent.servicer import response_of
from scrutiny.bookieclient import interpret, take, take_listed
from scrutiny.bookkeeper import ledger_metadata_pb2
from scrutiny.checks import BookieAnswer, BookieAnswers, expected_share
from scrutiny.codec import encode_groups
from scrutiny.config import ScanSettings
from scrutiny.listedcolumns import read_listed
from scrutiny.metadata import decode_ledger_metadata, encode_ledger_metadata
from scrutiny.metadata.columns import Znode
from scrutiny.metadata.ledger import V3_HEADER
from scrutiny.scan.classify import classify, select, wanted
from scrutiny.scan.context import Pass, RunContext
from scrutiny.scan.plain import PlainRange
from scrutiny.scan.work import YOUNG_COLLECTION_THRESHOLD
from scrutiny.store import LedgerRead
from scrutiny.v1 import bookie_pb2

Message = bookie_pb2.GetListOfEntriesOfLedgersResponse


def cluster(count: int) -> tuple[list[bytes], dict[tuple[str, bool], list[bytes]]]:
    """The ledgers' znodes and, per (bookie, as columns), its agent's stream messages of 1,000 answers each:
    answers as sub-messages, or the EOK ones as columns (as a scan asks for them: `listed_as_columns`)."""
    mds = list(synthetic_ledgers(count, 1000))
    per_bookie: dict[str, list[Any]] = {}
    for md in mds:
        for b in md.bookies:
            per_bookie.setdefault(b, []).append(bookie_pb2.GetListOfEntriesOfALedgerResponse(
                ledger_id=md.ledger_id, status=bookie_pb2.EOK,
                availability_of_entries_of_ledger=encode_groups(expected_share(md, b))))
    messages = {(b, columns): [response_of(a[i:i + 1000], columns).SerializeToString()
                               for i in range(0, len(a), 1000)]
                for b, a in per_bookie.items() for columns in (False, True)}
    return [encode_ledger_metadata(md) for md in mds], messages


def _encoded(bookie_id: str, ids: list[int], messages: list[bytes]) -> BookieAnswers:
    got = BookieAnswers(bookie_id)
    asked = set(ids)
    for m in messages:
        for ans in Message.FromString(m).ledgers:
            if ans.ledger_id in asked:
                take(bookie_id, ans.ledger_id, ans, got)
    return got


def _columns(bookie_id: str, ids: list[int], messages: list[bytes]) -> BookieAnswers:
    got = BookieAnswers(bookie_id)
    asked, asked_ids = set(ids), np.asarray(sorted(ids), np.int64)
    for m in messages:
        msg = Message.FromString(m)
        for ans in msg.ledgers:
            if ans.ledger_id in asked:
                take(bookie_id, ans.ledger_id, ans, got)
        take_listed(bookie_id, read_listed(msg.listed), asked_ids, got)
    return got


def _decoded(bookie_id: str, _: list[int], messages: list[bytes]) -> dict[int, BookieAnswer]:
    got: dict[int, BookieAnswer] = {}
    for m in messages:
        for ans in Message.FromString(m).ledgers:
            got.setdefault(ans.ledger_id, interpret(bookie_id, ans))
    return got


def run(count: int, repeats: int = 5) -> list[dict[str, object]]:
    znodes, messages = cluster(count)
    locations = {bookie(n): rack_of(n) for n in range(BOOKIES)}
    ctx = RunContext(ScanSettings(metadata_service_uri="zk+hierarchical://127.0.0.1:2181/ledgers"), locations,
                     {}, {}, 10**13, blast_radius=True)
    young, *older = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, *older)  # as an executor runs

    def once(read_answers: Callable[[str, list[int], list[bytes]], Any], grouped: bool) -> tuple[float, float, float]:
        t0 = time.process_time()
        reads = [LedgerRead(i, decode_ledger_metadata(i, z, 1, 0, znode_mtime=1)) for i, z in enumerate(znodes)]
        candidates = select(ctx, reads).candidates
        t1 = time.process_time()
        columns = read_answers is _columns
        answers = {b: read_answers(b, ids, messages[b, columns]) for b, ids in wanted(candidates).items()}
        t2 = time.process_time()
        result = classify(ctx, Pass.FIRST, candidates, answers, grouped=grouped)
        t3 = time.process_time()
        assert len(candidates) == count and not result.violations and not result.potentially_faulty
        return t1 - t0, t2 - t1, t3 - t2

    def in_columns() -> tuple[float, float, float]:
        t0 = time.process_time()
        plain = PlainRange.of(ctx, [Znode(i, z, 1, 0, 1) for i, z in enumerate(znodes)])
        t1 = time.process_time()
        answers = {b: _columns(b, ids, messages[b, True]) for b, ids in plain.wanted().items()}
        t2 = time.process_time()
        result = plain.classify(ctx, Pass.FIRST, answers)
        t3 = time.process_time()
        assert result.counts["checked"] == count and not result.violations and not result.potentially_faulty
        return t1 - t0, t2 - t1, t3 - t2

    rows: list[dict[str, object]] = []
    try:
        for name, way in (("answers decoded, each ledger alone (baseline)", lambda: once(_decoded, False)),
                          ("answers kept encoded, shares compared in bulk", lambda: once(_encoded, False)),
                          ("the same, healthy ledgers a group at a time", lambda: once(_encoded, True)),
                          ("the same, the answers as columns", lambda: once(_columns, True)),
                          ("the plain ledgers in columns (as a first pass reads them)", in_columns)):
            best = [min(t) for t in zip(*(way() for _ in range(repeats)), strict=True)]
            us = [t / count * 1e6 for t in best]
            rows.append({"how": name, "ledgers": count, "metadata us": us[0], "answers us": us[1],
                         "classify us": us[2], "us per ledger": sum(us)})
    finally:
        gc.set_threshold(young, *older)
    base = rows[0]["us per ledger"]
    for r in rows:
        r["x baseline"] = base / r["us per ledger"]  # type: ignore[operator]
    return rows


def metadata_floor(count: int, repeats: int = 5) -> list[dict[str, object]]:
    """The per-ledger floor of decoding with protobuf's objects: each message parsed; parsed and every field read."""
    bodies = []
    for z in cluster(count)[0]:
        length, at = pb_decoder._DecodeVarint32(z, len(V3_HEADER))  # type: ignore[attr-defined]
        assert z.startswith(V3_HEADER)
        bodies.append(z[at:at + length])
    message = ledger_metadata_pb2.LedgerMetadataFormat

    def parsed() -> None:
        for body in bodies:
            message.FromString(body)

    def read() -> None:
        for body in bodies:
            m = message.FromString(body)
            (m.quorumSize, m.ensembleSize, m.ackQuorumSize, m.lastEntryId, m.state, m.length, m.ctime, m.digestType,
             m.password, m.cToken, [(c.key, c.value) for c in m.customMetadata],
             [(s.firstEntryId, tuple(s.ensembleMember)) for s in m.segment])

    def best(work: Callable[[], None]) -> float:
        times = []
        for _ in range(repeats):
            t0 = time.process_time()
            work()
            times.append(time.process_time() - t0)
        return min(times) / count * 1e6

    return [{"floor": "each znode's message parsed (protobuf)", "us per ledger": best(parsed)},
            {"floor": "parsed, every field a check uses read", "us per ledger": best(read)}]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ledgers", type=int, default=20_000)
    p.add_argument("--repeats", type=int, default=7)
    a = p.parse_args()
    print(table(run(a.ledgers, a.repeats)))
    print()
    print(table(metadata_floor(a.ledgers, a.repeats)))


if __name__ == "__main__":
    main()
