"""Continuous scrutiny of Pulsar's record: the watch on the managed ledgers, their cursors and the schemas
(in Pulsar's metadata store, BookKeeper's unless `pulsar_metadata_uri` names another), and which topic each
ledger belongs to, so that a ledger deleted or closed in BookKeeper's metadata names the topic to look at.

The ledger -> topic map comes from one read of every record when the leader starts (and again after a gap
in the watch); each look at a topic updates it with the record that look read. Its ledger events that
come before the first read are kept and named once it is done. A deleted ledger's metadata says nothing of
its owner, which is why the map is kept at all.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterable

from scrutiny.config import ScanSettings
from scrutiny.pulsar.owners import topic_of_owner
from scrutiny.pulsar.snapshot import PulsarRecord
from scrutiny.store import MetadataStore, TreeWatchHandle, open_store

log = logging.getLogger(__name__)
RETRY_SECONDS = 5.0


class TopicFeed:
    """`look(topic, why, after_s)` is called for each topic to look at (on the store's thread, or this feed's:
    it must only take note); `gap(why)` when the watch may have missed changes."""

    def __init__(self, scan: ScanSettings, look: Callable[[str, str, float], None],
                 gap: Callable[[str], None]) -> None:
        self.scan, self._look, self._gap = scan, look, gap
        self._lock = threading.Lock()
        self._topic_of: dict[int, str] | None = None  # ledger -> topic (None: not read yet)
        self._early: list[tuple[int, str, float]] = []  # ledger events before the first read
        self._store: MetadataStore | None = None
        self._own_store = False
        self._watch: TreeWatchHandle | None = None
        self._stop = threading.Event()
        self._reader: threading.Thread | None = None

    def start(self, store: MetadataStore) -> str:
        """Watch Pulsar's records and read the map; the feed's state (up, unavailable, or "" when off)."""
        if not self.scan.pulsar_check:
            return ""
        self._stop.clear()
        try:
            if self.scan.pulsar_metadata_uri:
                self._store = open_store(dataclasses.replace(self.scan,
                                                             metadata_service_uri=self.scan.pulsar_metadata_uri))
                self._own_store = True
            else:
                self._store = store
            self._watch = self._store.watch_topics(self._on_topic, self._on_gap)
        except Exception as exc:  # Pulsar's store away: its records are checked by the runs only
            log.warning("continuous scrutiny: cannot watch Pulsar's records (%s): full runs check them", exc)
            return "unavailable"
        self._read_map()
        return "up" if self._watch is not None else "unavailable"

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.join(timeout=10)
        if self._own_store and self._store is not None:
            self._store.close()
        self._store, self._own_store = None, False
        with self._lock:
            self._topic_of, self._early = None, []

    def _on_topic(self, topic: str) -> None:
        self._look(topic, "its record changed", 0.0)

    def _on_gap(self, why: str) -> None:
        self._gap(why)
        self._read_map()  # a ledger that a record named meanwhile is not in the map

    def ledger_changed(self, ledger_id: int, why: str, after_s: float = 0.0) -> None:
        """A ledger deleted or changed in BookKeeper's metadata: its topic, if a record names it, is looked at."""
        with self._lock:
            if self._topic_of is None:
                self._early.append((ledger_id, why, after_s))
                return
            topic = self._topic_of.get(ledger_id)
        if topic is not None:
            self._look(topic, f"ledger {ledger_id} {why}", after_s)

    def learned(self, topics: Iterable[str], record: PulsarRecord) -> None:
        """These topics' records as a look at them read them: the map follows them."""
        wanted = set(topics)
        if self._topic_of is None:
            return
        named = {n.ledger_id: topic_of_owner(n.owner) for n in record.needs()}
        with self._lock:
            if self._topic_of is None:
                return
            for lid in [lid for lid, t in self._topic_of.items() if t in wanted]:
                del self._topic_of[lid]
            self._topic_of.update({lid: t for lid, t in named.items() if t in wanted})

    def mapped(self) -> int:
        with self._lock:
            return len(self._topic_of or ())

    def _read_map(self) -> None:
        """Every record read, on a thread of its own (a large cluster's take seconds), until it succeeds."""
        if self._reader is not None and self._reader.is_alive():
            return
        reader = threading.Thread(target=self._read_until_done, name="continuous-topic-map", daemon=True)
        reader.start()
        self._reader = reader  # only once started: a stop on another thread (the leader's end) joins it

    def _read_until_done(self) -> None:
        while not self._stop.is_set() and self._store is not None:
            try:
                record = PulsarRecord.decode(self._store.pulsar_records())
                break
            except Exception as exc:  # the store away for a moment
                log.info("continuous scrutiny: cannot read Pulsar's records now (%s): trying again", exc)
                self._stop.wait(RETRY_SECONDS)
        else:
            return
        named = {n.ledger_id: topic_of_owner(n.owner) for n in record.needs()}
        with self._lock:
            early, self._early = self._early, []
            self._topic_of = named
        for lid, why, after_s in early:
            self.ledger_changed(lid, why, after_s)
