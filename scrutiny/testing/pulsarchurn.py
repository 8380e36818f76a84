"""Pulsar's own operations on a churning cluster (`ChurnCluster`), only ever legally and in the order Pulsar's
brokers do them: a ledger created before a record names it, dropped from the record before it is deleted
(`docs/formats.md` 19). Topics publish, roll over, trim, offload (and later delete from
BookKeeper), switch cursor ledgers, add schema versions, compact, and are deleted and created; then faults of
each class the topics phase reports."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from scrutiny.metadata import LedgerMetadata, LedgerState, Segment
from scrutiny.pulsar import encode
from scrutiny.pulsar.codec import COMPRESSIONS
from scrutiny.pulsar.records import COMPACTION_CURSOR, LedgerInfo, Position, managed_ledger_of, schema_id_of
from scrutiny.testing.churn import ChurnCluster
from scrutiny.testing.holdings import share


@dataclass
class Cursor:
    ledger_id: int = -1  # -1: the position is inline in the record
    mark_delete: Position | None = None


@dataclass
class Topic:
    name: str
    ledgers: list[LedgerInfo] = field(default_factory=list)  # as the record lists them; the last, the open head
    written: int = 0  # entries written to the head
    cursors: dict[str, Cursor] = field(default_factory=dict)
    compacted: int = -1
    schema: list[tuple[int, int]] = field(default_factory=list)  # (version, ledger id)

    @property
    def managed_ledger(self) -> str:
        return managed_ledger_of(self.name)

    @property
    def head(self) -> LedgerInfo:
        return self.ledgers[-1]


class PulsarChurn:
    def __init__(self, cluster: ChurnCluster, topics: int = 6) -> None:
        self.cluster = cluster
        self.rng = cluster.rng
        self.topics: dict[str, Topic] = {}
        self.metadata: dict[int, LedgerMetadata] = {}  # what BookKeeper has of the topics' ledgers
        self.frozen: set[str] = set()  # the faults' topics: left alone
        self._made = 0
        for _ in range(topics):
            self.create_topic()

    # -- BookKeeper's side, as a broker's client sees it ----------------------------------------------

    def _ledger(self, keys: tuple[tuple[str, bytes], ...]) -> int:
        c = self.cluster
        with c.lock:
            lid, c.next_id = c.next_id, c.next_id + 1
        # never on the last bookie: the cluster's own faults take it away for good
        ensemble = tuple(self.rng.sample(c.bookies[:-1], 3))
        md = LedgerMetadata(lid, LedgerState.OPEN, 3, 2, 2, -1, 0, (Segment(0, ensemble),), custom_metadata=keys)
        c.writer.write_ledgers([md])
        self.metadata[lid] = md
        return lid

    def _close(self, lid: int, entries: int, held: int | None = None) -> None:
        """Closed at `entries`; its bookies hold `held` of them (all, unless a fault says otherwise)."""
        md = dataclasses.replace(self.metadata[lid], state=LedgerState.CLOSED, last_entry_id=entries - 1,
                                 length=entries * 100)
        copied = dataclasses.replace(md, last_entry_id=(entries if held is None else held) - 1)
        for b in md.bookies:
            if copied.last_entry_id >= 0:
                self.cluster.holdings[b].put(lid, share(copied, b))
        self.cluster.writer.update_ledger(md)
        self.metadata[lid] = md

    def delete_ledger(self, lid: int) -> None:
        """Deleted from BookKeeper's metadata, and collected from its bookies."""
        md = self.metadata.pop(lid, None)
        if md is None:
            return
        self.cluster.writer.delete_ledger(lid)
        for b in md.bookies:  # collected by the bookies' garbage collectors
            self.cluster.holdings[b].drop(lid)

    # -- the records, as the broker writes them -------------------------------------------------------

    def write_record(self, t: Topic) -> None:
        self.cluster.writer.write_managed_ledger(t.managed_ledger,
                                                 encode.managed_ledger(t.ledgers, self.rng.choice(COMPRESSIONS)))

    def _cursor(self, t: Topic, sub: str) -> None:
        c = t.cursors[sub]
        props = {"CompactedTopicLedger": t.compacted} if sub == COMPACTION_CURSOR and t.compacted >= 0 else None
        data = encode.cursor(c.ledger_id, c.mark_delete if c.ledger_id < 0 else None, properties=props,
                             compression=self.rng.choice(COMPRESSIONS))
        self.cluster.writer.write_cursor(t.managed_ledger, encode.cursor_node(sub), data)

    # -- Pulsar's operations --------------------------------------------------------------------------

    def create_topic(self, name: str = "") -> Topic:
        self._made += 1
        t = Topic(name or f"persistent://public/default/churn-{self._made}")
        self.cluster.writer.write_managed_ledger(t.managed_ledger, b"")  # createIfMissing writes 0 bytes first
        t.ledgers.append(LedgerInfo(self._ledger(encode.ledger_keys("topic", t.name))))
        self.write_record(t)
        for sub in ("sub-a", "sub-b"):
            t.cursors[sub] = Cursor(mark_delete=Position(t.head.ledger_id, -1))
            self._cursor(t, sub)
        self.topics[t.name] = t
        self.schema_version(t)
        return t

    def publish(self, t: Topic) -> None:
        t.written += self.rng.randint(1, 30)

    def rollover(self, t: Topic) -> None:
        """The head closed, a new ledger created, then the record updated with both."""
        if not t.written:
            return
        head = t.head.ledger_id
        self._close(head, t.written)
        new = self._ledger(encode.ledger_keys("topic", t.name))
        t.ledgers[-1] = LedgerInfo(head, t.written, t.written * 100)
        t.ledgers.append(LedgerInfo(new))
        t.written = 0
        self.write_record(t)

    def acknowledge(self, t: Topic) -> None:
        """An inline cursor's mark-delete moved forward, within what was written."""
        sub = self.rng.choice([s for s in t.cursors if s != COMPACTION_CURSOR])
        c = t.cursors[sub]
        if c.ledger_id >= 0:
            return
        at = self.rng.choice(t.ledgers)
        last = (at.entries if at.entries is not None else t.written) - 1
        if c.mark_delete is not None and c.mark_delete >= (at.ledger_id, last):
            return
        c.mark_delete = Position(at.ledger_id, self.rng.randint(-1, last))
        self._cursor(t, sub)

    def trim(self, t: Topic) -> None:
        """The first ledger, consumed by every cursor, dropped from the record, then deleted (two steps)."""
        if len(t.ledgers) < 3:
            return
        first, second = t.ledgers[0], t.ledgers[1]
        for sub, c in t.cursors.items():
            if c.ledger_id < 0 and (c.mark_delete is None or c.mark_delete.ledger_id <= first.ledger_id):
                c.mark_delete = Position(second.ledger_id, -1)
                self._cursor(t, sub)
        t.ledgers.pop(0)
        self.write_record(t)
        self.delete_ledger(first.ledger_id)

    def offload(self, t: Topic) -> None:
        """A closed ledger offloaded (complete); on a later step, past the deletion lag, marked deleted from
        BookKeeper in the record, then deleted."""
        for i, li in enumerate(t.ledgers[:-1]):
            if li.offloaded and not li.bookkeeper_deleted:
                t.ledgers[i] = dataclasses.replace(li, bookkeeper_deleted=True)
                self.write_record(t)
                self.delete_ledger(li.ledger_id)
                return
        closed = [i for i, li in enumerate(t.ledgers[:-1]) if not li.offloaded]
        if closed:
            i = closed[0]
            t.ledgers[i] = dataclasses.replace(t.ledgers[i], offloaded=True)
            self.write_record(t)

    def switch_cursor(self, t: Topic) -> None:
        """A cursor's position moved into a new ledger of its own (or back inline), the old ledger deleted."""
        sub = self.rng.choice(["sub-a", "sub-b"])
        c = t.cursors[sub]
        old = c.ledger_id
        if old >= 0 and self.rng.random() < 0.5:
            c.ledger_id = -1  # back inline, as a cursor closed gracefully persists it
        else:
            c.ledger_id = self._ledger(encode.ledger_keys("cursor", t.name, sub))
        self._cursor(t, sub)
        if old >= 0:
            self.delete_ledger(old)

    def schema_version(self, t: Topic) -> None:
        lid = self._ledger(encode.ledger_keys("schema", schema_id=schema_id_of(t.name)))
        self._close(lid, 1)
        t.schema.append((len(t.schema), lid))
        self.cluster.writer.write_schema(schema_id_of(t.name), encode.schema_locator(t.schema))

    def compact(self, t: Topic) -> None:
        """A compacted ledger written and closed, then named by the compaction cursor; the old one deleted."""
        lid = self._ledger(encode.ledger_keys("compacted-topic", t.name))
        self._close(lid, self.rng.randint(1, 20))
        old, t.compacted = t.compacted, lid
        t.cursors.setdefault(COMPACTION_CURSOR, Cursor())
        self._cursor(t, COMPACTION_CURSOR)
        if old >= 0:
            self.delete_ledger(old)

    def unload(self, t: Topic) -> None:
        """A graceful unload of an idle topic: its head closed empty, the record left as it was."""
        self._close(t.head.ledger_id, t.written)
        self.frozen.add(t.name)

    def delete_topic(self, t: Topic) -> None:
        """As a broker deletes a topic: its ledgers first, then its cursors' records and its own."""
        del self.topics[t.name]
        for lid in [li.ledger_id for li in t.ledgers] + [c.ledger_id for c in t.cursors.values()] + [t.compacted]:
            if lid >= 0:
                self.delete_ledger(lid)
        self.cluster.writer.delete_managed_ledger(t.managed_ledger, [encode.cursor_node(s) for s in t.cursors])

    def step(self) -> None:
        with self.cluster.lock:
            live = [t for name, t in self.topics.items() if name not in self.frozen]
            if not live:
                return
            t = self.rng.choice(live)
            op = self.rng.choice(["publish"] * 4 + ["rollover"] * 3 + ["acknowledge"] * 3 + ["trim"] * 2
                                 + ["offload", "switch_cursor", "schema_version", "compact", "delete_topic"])
            if op == "delete_topic":
                if self.rng.random() < 0.3:
                    self.delete_topic(t)
                    self.create_topic()
                    self.cluster.ops["pulsar_delete_topic"] += 1
                return
            getattr(self, op)(t)
            self.cluster.ops[f"pulsar_{op}"] += 1

    # -- faults -----------------------------------------------------------------------------------------

    def inject_faults(self) -> set[tuple[str, int]]:
        """One of each class, each on a topic of its own (then left alone):
        a data ledger deleted that the record still lists, and a schema version's ledger likewise
        (TOPIC_LEDGER_MISSING); a mark-delete past a closed ledger's entries (CURSOR_POSITION_NOT_IN_TOPIC); a
        record whose count for a closed ledger is one short (TOPIC_ENTRY_COUNT_MISMATCH); the head closed by a
        recovery while the broker wrote on and a cursor acknowledged past the close
        (TOPIC_WRITTEN_PAST_CLOSED_HEAD); a ledger dropped from the record whose delete failed (LEAKED_LEDGER)."""
        with self.cluster.lock:
            ts: list[Topic] = []
            while len(ts) < 5:
                t = self.create_topic()
                for _ in range(3):
                    self.publish(t)
                    self.rollover(t)
                t.written += 5
                ts.append(t)
            self.frozen |= {t.name for t in ts}
            lost, schema_lost, past, short, under, leak = (ts[0], ts[0], ts[1], ts[2], ts[3], ts[4])
            lost_ledger = lost.ledgers[1].ledger_id
            self.delete_ledger(lost_ledger)
            schema_ledger = schema_lost.schema[-1][1]
            self.delete_ledger(schema_ledger)
            target = past.ledgers[0]
            assert target.entries is not None
            past.cursors["sub-a"] = Cursor(mark_delete=Position(target.ledger_id, target.entries + 2))
            self._cursor(past, "sub-a")
            counted = short.ledgers[1]
            assert counted.entries is not None
            short.ledgers[1] = dataclasses.replace(counted, entries=counted.entries - 1)
            self.write_record(short)
            head = under.head.ledger_id
            self._close(head, under.written - 2)  # recovered short of what the broker had written on
            under.cursors["sub-b"] = Cursor(mark_delete=Position(head, under.written - 1))
            self._cursor(under, "sub-b")
            leaked = leak.ledgers.pop(0).ledger_id
            self.write_record(leak)  # and its delete failed
        return {("TOPIC_LEDGER_MISSING", lost_ledger), ("TOPIC_LEDGER_MISSING", schema_ledger),
                ("CURSOR_POSITION_NOT_IN_TOPIC", target.ledger_id), ("TOPIC_ENTRY_COUNT_MISMATCH", counted.ledger_id),
                ("TOPIC_WRITTEN_PAST_CLOSED_HEAD", head), ("LEAKED_LEDGER", leaked)}
