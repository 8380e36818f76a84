"""A replication worker for tests, behaving as BookKeeper's does (`ReplicationWorker`, `LedgerChecker`,
`LedgerFragmentReplicator`) over the test cluster's ZooKeeper and its bookies' in-memory holdings, so that
scrutiny's hand-off runs end to end.

For each mark: the lock (`underreplication/locks/urL%010d`, ephemeral; a locked ledger is another worker's);
the checker on each bookie's share of each fragment, reading only the share's first and last entry at
`auditorLedgerVerificationPercentage` 0, a random sample besides at n%, every entry at 100, and no digest; each
bad share copied whole to a writable bookie (registered under `available`, not read-only, as the placement
policy knows them) outside the fragment's ensemble (from the copies the others hold: an entry with none fails
the copy, the mark stays), the ensemble changed in the metadata at its version; the checker again,
and the mark removed when it finds nothing (`markLedgerReplicated`), also when the ledger is gone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
from collections.abc import Iterator, Mapping

import numpy as np
from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from scrutiny.checks.shares import share_rows
from scrutiny.codec import Availability, SequenceGroup
from scrutiny.metadata import (
    Layout,
    LedgerMetadata,
    Segment,
    decode_ledger_metadata,
    encode_ledger_metadata,
    ledger_id_of_mark,
    ledger_path,
)
from scrutiny.testing.holdings import MutableHoldings
from scrutiny.testing.localetcd import EtcdTree

REPLICATED, NOTHING_BAD, GONE, KEPT = "replicated", "unmarked: its checker found nothing", "ledger gone", "kept"


def fragment_share(md: LedgerMetadata, fragment: tuple[Segment, int, int], bookie: str) -> np.ndarray:
    """The entries of a fragment (`segment_ranges`) that `bookie` stores."""
    seg, lo, hi = fragment
    rows = share_rows(md.ensemble_size, md.write_quorum, seg.ensemble.index(bookie), lo, hi)
    return Availability.of([SequenceGroup._make(r) for r in rows]).entry_ids()


class ReplicationWorker:
    """On ZooKeeper (a KazooClient), or on Pulsar's metadata store on etcd (the tests' EtcdTree)."""

    def __init__(self, client: KazooClient | EtcdTree, root: str, holdings: Mapping[str, MutableHoldings],
                 percentage: int = 0, layout: Layout = Layout.HIERARCHICAL, seed: int = 1) -> None:
        self.client, self.root, self.holdings, self.percentage = client, root, holdings, percentage
        self.layout = layout
        self.random = random.Random(seed)

    def _marks(self) -> Iterator[tuple[int, str]]:
        level = [f"{self.root}/underreplication/ledgers"]
        for _ in range(4):
            level = [f"{p}/{c}" for p in level for c in self._children(p)]
        for parent in level:
            for name in self._children(parent):
                lid = ledger_id_of_mark(name)
                if lid is not None:
                    yield lid, f"{parent}/{name}"

    def _children(self, path: str) -> list[str]:
        try:
            return sorted(self.client.get_children(path))
        except NoNodeError:
            return []

    def run_once(self) -> list[tuple[int, str]]:
        """Each marked ledger taken once; what became of it."""
        done = []
        for lid, mark in list(self._marks()):
            lock = f"{self.root}/underreplication/locks/urL{lid:010d}"
            try:
                self.client.create(lock, b"", ephemeral=True, makepath=True)
            except NodeExistsError:
                continue
            try:
                done.append((lid, self._rereplicate(lid, mark)))
            finally:
                self.client.delete(lock)
        return done

    def _rereplicate(self, lid: int, mark: str) -> str:
        try:
            _, mark_stat = self.client.get(mark)
            data, stat = self.client.get(ledger_path(self.layout, self.root, lid))
        except NoNodeError:
            self._unmark(mark, None)
            return GONE
        md = decode_ledger_metadata(lid, data, stat.ctime, stat.version)
        bad = self.check(md)
        if not bad:
            self._unmark(mark, mark_stat.version)
            return NOTHING_BAD
        for fragment, bookie in bad:
            replaced = self._copy(md, fragment, bookie)
            if replaced is None:
                return KEPT
            md = replaced
        try:
            self.client.set(ledger_path(self.layout, self.root, lid), encode_ledger_metadata(md), stat.version)
        except BadVersionError:
            return KEPT  # the metadata changed meanwhile: the next pass looks again
        if self.check(md):
            return KEPT
        self._unmark(mark, mark_stat.version)
        return REPLICATED

    def _unmark(self, mark: str, version: int | None) -> None:
        with contextlib.suppress(NoNodeError, BadVersionError):  # marked again meanwhile: for the next pass
            self.client.delete(mark, -1 if version is None else version)

    def check(self, md: LedgerMetadata) -> list[tuple[tuple[Segment, int, int], str]]:
        """The bad shares (fragment, bookie), as `LedgerChecker` finds them at this percentage."""
        bad = []
        for fragment in md.segment_ranges():
            for bookie in dict.fromkeys(fragment[0].ensemble):
                wanted = fragment_share(md, fragment, bookie)
                if not len(wanted):
                    continue
                if self.percentage >= 100:
                    read = wanted
                else:
                    sample = [e for e in wanted[1:-1] if self.random.random() * 100 < self.percentage]
                    read = np.unique(np.array([wanted[0], *sample, wanted[-1]], dtype=np.int64))
                held = self.holdings.get(bookie)
                if held is None or not np.isin(read, held.held(md.ledger_id)).all():
                    bad.append((fragment, bookie))
        return bad

    def _copy(self, md: LedgerMetadata, fragment: tuple[Segment, int, int], bookie: str) -> LedgerMetadata | None:
        """The share copied whole to a bookie outside the fragment's ensemble, read from the others; the new
        metadata, or None when some entry has no copy to read."""
        # this fragment's segment as `md` has it now (an earlier copy may have changed its ensemble); an empty
        # segment before it starts at the same entry
        index = max(i for i, s in enumerate(md.segments) if s.first_entry_id == fragment[0].first_entry_id)
        seg = md.segments[index]
        fragment = (seg, *fragment[1:])
        writable = set(self._children(f"{self.root}/available")) - {"readonly"}
        target = next((b for b in sorted(self.holdings) if b in writable and b not in seg.ensemble), None)
        if target is None:
            return None
        entries = fragment_share(md, fragment, bookie)
        elsewhere = [self.holdings[b].held(md.ledger_id) for b in seg.ensemble
                     if b != bookie and b in self.holdings]
        sources = np.unique(np.concatenate(elsewhere)) if elsewhere else np.array([], dtype=np.int64)
        if not np.isin(entries, sources).all():
            return None
        self.holdings[target].put(md.ledger_id, entries)
        ensemble = tuple(target if b == bookie else b for b in seg.ensemble)
        segments = (*md.segments[:index], Segment(seg.first_entry_id, ensemble), *md.segments[index + 1:])
        return dataclasses.replace(md, segments=segments)
