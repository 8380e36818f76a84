"""Pulsar's record held against BookKeeper's: the records decoded in every form Pulsar writes them, and each
class of finding (and each legal case that is none) from the pure checks."""

from __future__ import annotations

import pytest

from scrutiny.categories import Category
from scrutiny.checks.topics import check_topics, leaked, unnamed
from scrutiny.errors import MetadataError
from scrutiny.metadata import LedgerMetadata, LedgerState, Segment
from scrutiny.pulsar import encode
from scrutiny.pulsar.codec import COMPRESSIONS
from scrutiny.pulsar.ledgers import BookKeeperLedgers
from scrutiny.pulsar.owners import Owner
from scrutiny.pulsar.records import (
    CursorRecord,
    LedgerInfo,
    ManagedLedgerRecord,
    Position,
    SchemaRecord,
    schema_id_of,
    topic_of,
    topic_of_path,
)
from scrutiny.pulsar.snapshot import PulsarRecord, StoredRecords
from scrutiny.store import LedgerRead

TOPIC = "persistent://public/default/orders"
ML = "public/default/persistent/orders"
ENS = (Segment(0, ("b1:3181", "b2:3181", "b3:3181")),)


def ledger(lid: int, last: int = 9, closed: bool = True, kind: str = "topic", ctime: int = 1000,
           topic: str = TOPIC, cursor: str = "") -> LedgerRead:
    keys = encode.ledger_keys(kind, topic, cursor, schema_id_of(topic)) if kind else ()
    md = LedgerMetadata(lid, LedgerState.CLOSED if closed else LedgerState.OPEN, 3, 2, 2, last if closed else -1,
                        0, ENS, ctime, custom_metadata=keys)
    return LedgerRead(lid, md)


def record(ledgers: list[LedgerInfo], cursors: dict[str, bytes] | None = None,
           schemas: dict[str, bytes] | None = None, whole: bool = True) -> PulsarRecord:
    return PulsarRecord.decode(StoredRecords({ML: encode.managed_ledger(ledgers)}, {ML: cursors or {}},
                                             schemas or {}, whole))


def found(rec: PulsarRecord, *reads: LedgerRead) -> set[tuple[str, int]]:
    return {(str(v.category), v.ledger_id) for v in check_topics(rec, BookKeeperLedgers.of(reads))}


# -- the records, as Pulsar writes them ------------------------------------------------------------------

@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_every_record_in_every_compression(compression: str) -> None:
    ml = encode.managed_ledger([LedgerInfo(1, 5, 50), LedgerInfo(2)], compression)
    assert ManagedLedgerRecord.from_node(ML, ml).ledgers == (LedgerInfo(1, 5, 50), LedgerInfo(2))
    inline = encode.cursor(-1, Position(1, 3), [(Position(1, 4), Position(2, 0))], compression=compression)
    c = CursorRecord.from_node(f"{ML}/sub", "sub", inline)
    assert (c.ledger_id, c.mark_delete, c.acknowledged) == (-1, (1, 3), (((1, 4), (2, 0)),))
    assert CursorRecord.from_node(f"{ML}/sub", "sub", encode.cursor(77, compression=compression)).mark_delete is None


def test_the_empty_node_the_text_format_and_the_schema_locator() -> None:
    assert ManagedLedgerRecord.from_node(ML, b"").ledgers == ()  # createIfMissing writes 0 bytes first
    assert CursorRecord.from_node("c", "sub", b"") == CursorRecord("sub")
    text = b'ledgerInfo {\n  ledgerId: 3\n  entries: 7\n  size: 70\n}\nledgerInfo {\n  ledgerId: 4\n}\n'
    assert ManagedLedgerRecord.from_node(ML, text).ledgers == (LedgerInfo(3, 7, 70), LedgerInfo(4))
    cursor_text = b"cursorsLedgerId: -1\nmarkDeleteLedgerId: 3\nmarkDeleteEntryId: 2\nlastActive: 5\n"
    assert CursorRecord.from_node("c", "sub", cursor_text).mark_delete == (3, 2)
    schema = SchemaRecord.from_node("public/default/orders", encode.schema_locator([(0, 40), (1, 41)]))
    assert schema.versions == ((0, 40), (1, 41))
    with pytest.raises(MetadataError, match="managed ledger public/default/persistent/orders: undecodable"):
        ManagedLedgerRecord.from_node(ML, b"\x0a\xff\xff")
    with pytest.raises(MetadataError, match="cursor c: undecodable"):
        CursorRecord.from_node("c", "sub", b"cursorsLedgerId: nope\n")


def test_names_as_pulsar_encodes_them() -> None:
    assert topic_of("public/default/persistent/a+b%2Fc") == "persistent://public/default/a b/c"
    assert schema_id_of("persistent://public/default/orders-partition-3") == "public/default/orders"
    assert encode.cursor_node("my#sub") == "my%23sub"
    rec = record([LedgerInfo(1)], {"my%23sub": encode.cursor(-1, Position(1, -1))})
    assert set(rec.topics[ML].cursors) == {"my#sub"}


def test_the_topic_a_changed_node_concerns() -> None:
    """What continuous mode's watch on Pulsar's records makes of a path."""
    ml, schemas = "/managed-ledgers", "/schemas"
    assert topic_of_path(ml, schemas, "/managed-ledgers/t/ns/persistent/a+b") == "persistent://t/ns/a b"
    assert topic_of_path(ml, schemas, "/managed-ledgers/t/ns/persistent/a/my%23sub") == "persistent://t/ns/a"
    assert topic_of_path(ml, schemas, "/managed-ledgers/p/c/ns/persistent/a") == "persistent://p/c/ns/a"  # v1
    assert topic_of_path(ml, schemas, "/schemas/t/ns/orders") == "persistent://t/ns/orders"
    for above in ("/managed-ledgers/t", "/managed-ledgers/t/ns/persistent", "/schemas/t/ns", "/ledgers/L0001",
                  "/managed-ledgers-x/t/ns/persistent/a"):
        assert topic_of_path(ml, schemas, above) is None


def test_one_bad_record_is_named_and_the_others_read() -> None:
    rec = PulsarRecord.decode(StoredRecords({ML: encode.managed_ledger([1]), "t/n/persistent/bad": b"\x0a\xff"},
                                            {ML: {"s": b"\xff\xff"}}))
    assert set(rec.topics) == {ML} and len(rec.problems) == 2


# -- what the record needs and BookKeeper lacks ------------------------------------------------------------

def test_a_ledger_each_kind_needs_is_missing() -> None:
    rec = record([LedgerInfo(1, 10, 100), LedgerInfo(2)],
                 {"sub": encode.cursor(3), "__compaction": encode.compaction_cursor(4)},
                 {"public/default/orders": encode.schema_locator([(0, 5), (1, 6)])})
    everything = [ledger(1), ledger(2, closed=False), ledger(3, kind="cursor", cursor="sub", closed=False),
                  ledger(4, kind="compacted-topic"), ledger(5, 0, kind="schema"), ledger(6, 0, kind="schema")]
    assert found(rec, *everything) == set()
    for gone in range(6):
        assert found(rec, *everything[:gone], *everything[gone + 1:]) == {("TOPIC_LEDGER_MISSING", gone + 1)}
    v = check_topics(rec, BookKeeperLedgers.of(everything[1:]))[0]
    assert v.details["kind"] == "data" and v.details["entries"] == 10 and v.details["bytes"] == 100
    v = check_topics(rec, BookKeeperLedgers.of([*everything[:2], *everything[3:]]))[0]
    assert (v.details["kind"], v.details["subscription"], v.owner.kind) == ("cursor", "sub", "cursor")


@pytest.mark.parametrize(("managed_ledger", "role", "says"), [
    ("pulsar/system/persistent/__transaction_log_3", "coordinator-log", "transaction coordinator 3's log"),
    ("public/default/persistent/orders-audit__transaction_pending_ack", "pending-ack", "subscription cannot load"),
    ("public/default/persistent/__transaction_buffer_snapshot", "buffer-snapshots", "transaction buffer"),
    ("public/default/persistent/orders", "", "the topic cannot load"),
])
def test_a_transaction_ledger_missing_says_what_it_means_for_transactions(managed_ledger: str, role: str,
                                                                          says: str) -> None:
    rec = PulsarRecord.decode(StoredRecords({managed_ledger: encode.managed_ledger([LedgerInfo(1, 10, 100),
                                                                                    LedgerInfo(2)])}, {}, {}, True))
    topic = next(iter(rec.topics.values())).topic
    (v,) = check_topics(rec, BookKeeperLedgers.of([ledger(2, closed=False, topic=topic)]))
    assert (str(v.category), v.ledger_id, v.owner) == ("TOPIC_LEDGER_MISSING", 1, Owner("topic", topic))
    assert v.details.get("transactions", "") == role and says in v.details["depends"], v.details


def test_an_offloaded_ledger_deleted_from_bookkeeper_is_no_finding() -> None:
    rec = record([LedgerInfo(1, 10, 100, offloaded=True, bookkeeper_deleted=True), LedgerInfo(2, 10, 100, True),
                  LedgerInfo(3)])
    assert found(rec, ledger(3, closed=False)) == {("TOPIC_LEDGER_MISSING", 2)}  # offloaded, not yet deleted


# -- cursors -----------------------------------------------------------------------------------------------

def test_cursor_positions() -> None:
    ledgers = [LedgerInfo(10, 5, 50), LedgerInfo(12, 5, 50), LedgerInfo(14)]
    bk = [ledger(10, 4), ledger(12, 4), ledger(14, closed=False)]
    legal = {"trimmed": Position(8, 3), "before": Position(11, -1), "inside": Position(12, 4),
             "head": Position(14, 99)}
    for name, pos in legal.items():
        assert found(record(ledgers, {"s": encode.cursor(-1, pos)}), *bk) == set(), name
    past = record(ledgers, {"s": encode.cursor(-1, Position(10, 4), [(Position(10, 4), Position(12, 5))])})
    assert found(past, *bk) == {("CURSOR_POSITION_NOT_IN_TOPIC", 12)}  # #24722: acknowledged past 5 entries
    nowhere = record(ledgers, {"s": encode.cursor(-1, Position(11, 0))})
    v, = check_topics(nowhere, BookKeeperLedgers.of(bk))
    assert v.category is Category.CURSOR_POSITION_NOT_IN_TOPIC and v.ledger_id == 11
    assert v.details["positions"][0]["subscription"] == "s" and "not among" in v.details["positions"][0]["reason"]
    in_ledger = record(ledgers, {"s": encode.cursor(30, Position(11, 0))})  # the ledger form: no position here
    assert found(in_ledger, *bk, ledger(30, kind="cursor", cursor="s", closed=False)) == set()


# -- counts and the head -----------------------------------------------------------------------------------

def test_counts_that_disagree() -> None:
    rec = record([LedgerInfo(1, 10, 100), LedgerInfo(2, 10, 100), LedgerInfo(3)])
    assert found(rec, ledger(1, 9), ledger(2, 12), ledger(3, closed=False)) == {("TOPIC_ENTRY_COUNT_MISMATCH", 2)}
    assert found(rec, ledger(1, 9), ledger(2, 9, closed=False), ledger(3, closed=False)) == set()  # in recovery


def test_the_head_closed_in_bookkeeper() -> None:
    ledgers = [LedgerInfo(1, 10, 100), LedgerInfo(2)]
    unloaded = record(ledgers, {"s": encode.cursor(-1, Position(1, 9))})
    assert found(unloaded, ledger(1), ledger(2, -1)) == {("TOPIC_HEAD_LEDGER_CLOSED", 2)}  # a graceful unload
    assert found(unloaded, ledger(1), ledger(2, closed=False)) == set()
    acked_past = record(ledgers, {"s": encode.cursor(-1, Position(2, 4))})
    v, = check_topics(acked_past, BookKeeperLedgers.of([ledger(1), ledger(2, -1)]))
    assert v.category is Category.TOPIC_WRITTEN_PAST_CLOSED_HEAD and "past the close" in v.details["evidence"][0]
    wrote_on = found(unloaded, ledger(1), ledger(2, -1), ledger(3, 20))  # a newer ledger of the topic, written
    assert wrote_on == {("TOPIC_WRITTEN_PAST_CLOSED_HEAD", 2)}
    other = found(unloaded, ledger(1), ledger(2, -1), ledger(3, 20, topic="persistent://public/default/x"))
    assert other == {("TOPIC_HEAD_LEDGER_CLOSED", 2)}
    terminated = PulsarRecord.decode(StoredRecords({ML: encode.managed_ledger(ledgers, terminated=Position(1, 9))}))
    assert found(terminated, ledger(1), ledger(2, -1)) == set()


# -- leaks -------------------------------------------------------------------------------------------------

def test_leaked_ledgers() -> None:
    rec = record([LedgerInfo(2, 10, 100), LedgerInfo(3)], {"s": encode.cursor(5)},
                 {"public/default/orders": encode.schema_locator([(0, 6)])})
    bk = BookKeeperLedgers.of([
        ledger(1, ctime=1),  # trimmed from the record long ago, its delete failed: leaked
        ledger(2), ledger(3, closed=False), ledger(5, kind="cursor", cursor="s", closed=False),
        ledger(6, 0, kind="schema"),
        ledger(7, ctime=95_000),  # unnamed for less than the grace: a rollover or a trim under way
        ledger(8, kind="", ctime=1),  # not Pulsar's (or too old to say): never a leak
        ledger(9, kind="compacted-topic", closed=False, ctime=1),  # a compaction writing it
        ledger(10, kind="schema", ctime=-1),  # no ctime (etcd): its age from when first seen unnamed
    ])
    suspects = unnamed(rec, bk)
    assert [f.ledger_id for f in suspects] == [1, 7, 9, 10]
    assert [f.ledger_id for f in leaked(suspects, 100_000, 60, {})] == [1]
    assert [f.ledger_id for f in leaked(suspects, 100_000, 60, {10: 30_000})] == [1, 10]
    some = PulsarRecord.decode(StoredRecords({ML: encode.managed_ledger([2, 3])}, whole=False))
    assert unnamed(some, bk) == []  # some topics' record names too little to call anything leaked
