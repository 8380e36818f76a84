"""A range's plain ledgers checked in columns (`scan.plain`) against every znode decoded and checked alone."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
from google.protobuf.internal import decoder as pb_decoder
from google.protobuf.internal import encoder as pb_encoder
from hypothesis import given, settings
from hypothesis import strategies as st

from scrutiny.bookkeeper.ledger_metadata_pb2 import LedgerMetadataFormat
from scrutiny.checks import BookieAnswers
from scrutiny.metadata import LedgerMetadata, LedgerState, Segment
from scrutiny.metadata.columns import Znode, plain_ledgers
from scrutiny.metadata.ledger import V3_HEADER, encode_ledger_metadata
from scrutiny.pulsar.ledgers import BookKeeperLedgers
from scrutiny.scan.classify import classify, select, wanted
from scrutiny.scan.context import Pass, RunContext
from scrutiny.scan.plain import PlainRange
from scrutiny.scan.result import RangeResult
from scrutiny.store import LedgerRead
from tests.pure.test_healthy import B, cluster, context


def v3(body: bytes) -> bytes:
    return V3_HEADER + pb_encoder._VarintBytes(len(body)) + body  # type: ignore[attr-defined]


def body_of(md: LedgerMetadata) -> bytes:
    data = encode_ledger_metadata(md)
    length, at = pb_decoder._DecodeVarint32(data, len(V3_HEADER))  # type: ignore[attr-defined]
    return data[at:at + length]


def znode_of(rng: random.Random, md: LedgerMetadata) -> bytes | None:
    """Most as BookKeeper writes them (v3); some in the older formats, some a reader must refuse or look at twice."""
    roll = rng.random()
    if roll < 0.8:
        return encode_ledger_metadata(md)
    if roll < 0.84:
        return encode_ledger_metadata(md, rng.choice((1, 2)))
    if roll < 0.86:
        return None  # deleted before it was read
    if roll < 0.88:
        return encode_ledger_metadata(md)[:-3]  # cut short
    if roll < 0.9:  # a state protobuf does not know (it reads the default, CLOSED), last on the wire
        return v3(body_of(md) + b"\x28\x07")
    if roll < 0.92:  # a field twice: the last one counts
        return v3(body_of(md) + b"\x20" + pb_encoder._VarintBytes(md.last_entry_id + 5))  # type: ignore[attr-defined]
    if roll < 0.94:  # a bookie's id that is not UTF-8
        return encode_ledger_metadata(md).replace(b"b1:3181", b"b\xff:3181")
    if roll < 0.96:  # no ack quorum (BookKeeper before 4.3): the write quorum
        msg = LedgerMetadataFormat()
        msg.ParseFromString(body_of(md))
        msg.ClearField("ackQuorumSize")
        return v3(msg.SerializeToString())
    return encode_ledger_metadata(dataclasses.replace(md, state=rng.choice(list(LedgerState)),
                                                      last_entry_id=rng.choice((-1, md.last_entry_id, -2)),
                                                      ack_quorum=rng.choice((md.ack_quorum, 0, md.write_quorum + 1))))


def others(rng: random.Random, first: int) -> list[LedgerMetadata]:
    """Ledgers the columns leave alone: open, empty, named a bookie twice or an empty id, an ensemble of the
    wrong size, a first segment from another entry than 0."""
    out = []
    for lid in range(first, first + rng.randint(0, 8)):
        e = rng.randint(1, 4)
        ensemble = tuple(rng.sample(B, e))
        kind = rng.randrange(5)
        if kind == 1 and e > 1:
            ensemble = (ensemble[0], *ensemble[:-1])
        elif kind == 2:
            ensemble = ("", *ensemble[1:])
        elif kind == 3:
            ensemble = ensemble[:-1] or ensemble
        out.append(LedgerMetadata(lid, rng.choice(list(LedgerState)), e, rng.randint(1, e), 1, rng.randint(-1, 9), 0,
                                  (Segment(rng.randint(1, 3) if kind == 4 else 0, ensemble),)))
    return out


def reference(ctx: RunContext, znodes: list[Znode], answers: dict[str, BookieAnswers]) -> RangeResult:
    s = select(ctx, [LedgerRead.of(*z) for z in znodes])
    return RangeResult.merge([RangeResult(s.counts, s.violations, deleted=s.deleted,
                                          marked_in_scope=s.marked_in_scope),
                              classify(ctx, Pass.FIRST, s.candidates, answers, None, s.marked)])


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_columns_and_each_znode_alone_find_the_same(seed: int) -> None:
    """Every finding and its order, every count, the ledgers left for another look, the blast radius and its
    topics; every bookie asked about the same ledgers; every ledger in brief for Pulsar's record."""
    rng = random.Random(seed)
    mds, answers = cluster(rng, rng.randint(1, 150))
    mds += others(rng, len(mds))
    mds = [dataclasses.replace(md, ctime=rng.choice((-1, -1, 0, 10**12 + md.ledger_id))) for md in mds]
    ctx = context(rng, mds)
    ctx = dataclasses.replace(ctx, marked={md.ledger_id: () for md in mds if rng.random() < 0.05},
                              only_bookies=frozenset(rng.sample(B, rng.randint(1, 3))) if rng.random() < 0.3
                              else frozenset())
    znodes = [Znode(md.ledger_id, znode_of(rng, md), rng.randint(-1, 10**12), rng.randint(0, 9),
                    rng.randint(-1, 10**12)) for md in mds]
    plain = PlainRange.of(ctx, znodes)
    reads = [LedgerRead.of(*z) for z in znodes]
    expected = select(ctx, reads)
    assert {b: sorted(ids) for b, ids in plain.wanted().items()} == {
        b: sorted(ids) for b, ids in wanted(expected.candidates).items()}
    assert plain.classify(ctx, Pass.FIRST, answers) == reference(ctx, znodes, answers)
    brief, expected_brief = plain.brief(), BookKeeperLedgers.of(reads)  # what Pulsar's record is held against
    for column in ("ids", "last_entry", "ctime", "flags", "owner"):
        assert getattr(brief, column).tolist() == getattr(expected_brief, column).tolist(), column


def test_a_plain_ledger_is_read_as_its_metadata_says() -> None:
    """The columns of plain ledgers are those of their metadata; the others are not among them."""
    rng = random.Random(7)
    mds, _ = cluster(rng, 200)
    mds = [md for md in mds if len(md.segments) == 1 and md.last_entry_id >= 0]
    znodes = [Znode(md.ledger_id, encode_ledger_metadata(md)) for md in mds]
    znodes.insert(3, Znode(10_000, encode_ledger_metadata(mds[0], 1)))  # v1: not read in columns
    msg = LedgerMetadataFormat()
    msg.ParseFromString(body_of(mds[9]))
    msg.ClearField("ackQuorumSize")  # BookKeeper before 4.3: the write quorum
    znodes[10] = Znode(mds[9].ledger_id, v3(msg.SerializeToString()))
    mds[9] = dataclasses.replace(mds[9], ack_quorum=mds[9].write_quorum)
    got = plain_ledgers(znodes, np.array([mds[5].ledger_id]))  # marked, say
    assert got.ledger_ids.tolist() == [md.ledger_id for md in mds if md is not mds[5]]
    for i, md in enumerate(md for md in mds if md is not mds[5]):
        e = got.ensemble_size[i]
        assert (e, got.write_quorum[i], got.ack_quorum[i], got.last_entry_id[i]) == (
            md.ensemble_size, md.write_quorum, md.ack_quorum, md.last_entry_id)
        assert tuple(got.bookies[b] for b in got.members[i, :e]) == md.segments[0].ensemble
        assert (got.members[i, e:] == -1).all()
        assert (got.customs[got.owner[i]] if got.owner[i] >= 0 else ()) == md.custom_metadata
        assert znodes[got.rows[i]].ledger_id == md.ledger_id


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(0, 40), width=st.integers(1, 9), high=st.sampled_from((1, 3, 200, 10**6, 2**40)),
       seed=st.integers(0, 2**32 - 1))
def test_distinct_rows_are_numpys_whether_or_not_a_row_fits_in_one_number(rows: int, width: int, high: int,
                                                                            seed: int) -> None:
    from scrutiny.scan.healthy import _distinct_rows

    matrix = np.random.default_rng(seed).integers(-1, high, size=(rows, width))
    matrix[rows // 2:] = matrix[:rows - rows // 2]  # rows alike
    distinct, first, which = _distinct_rows(matrix)
    expected, expected_first, expected_which = np.unique(matrix, axis=0, return_index=True, return_inverse=True)
    assert distinct.tolist() == expected.tolist() and first.tolist() == expected_first.tolist()
    assert which.tolist() == expected_which.ravel().tolist()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=200), max_size=8))
def test_bytes_of_any_kind_never_stop_the_columns(tails: list[bytes]) -> None:
    """Each plain ledger is one the reference decodes, closed, with entries; the rest is the reference's to name."""
    znodes = [Znode(i, V3_HEADER + tail if i % 3 else tail) for i, tail in enumerate(tails)]
    got = plain_ledgers(znodes)
    for row in got.rows.tolist():
        md = LedgerRead.of(*znodes[row]).metadata
        assert md is not None and md.state is LedgerState.CLOSED and md.last_entry_id >= 0
