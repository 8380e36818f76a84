"""The current state as the leader keeps it for the next one: what is wrong now, found by the last full run and
by continuous scrutiny since. A loss only continuous mode has found would otherwise live in the leader's memory
alone: a failover would clear its alert until the new leader's own full run ended (minutes at a million
ledgers). The leader writes the state to the store whenever it changed (at most every few seconds); a new leader
reads it on election, exports it at once, and looks at its ledgers again (`Continuous.look_again`): each finding
it kept is confirmed or cleared within seconds, and its takeover full run replaces the whole state.

Bounded for the store (a ZooKeeper znode, an etcd value): the worst MOST findings whole, the rest as counts per
category (`beyond`), compressed."""

from __future__ import annotations

import json
import logging
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from scrutiny.auditor.currentstate import Current, CurrentState
from scrutiny.checks import Violation
from scrutiny.errors import DataError, one_line
from scrutiny.records import LeaderRecord, RecordStore
from scrutiny.times import now_ms

log = logging.getLogger(__name__)
FORMAT = 1
MOST = 2000  # findings kept whole
MOST_BYTES = 512 * 1024  # compressed: well inside ZooKeeper's jute.maxbuffer (1 MiB) and etcd's request limit


@dataclass(frozen=True)
class KeptState:
    found: tuple[Current, ...] = ()
    beyond: dict[str, int] = field(default_factory=dict)  # category -> findings not kept whole
    baseline_ms: int = 0  # when the full run the state rests on started (0: none)
    baseline_kind: str = ""
    last_full_ms: int = 0
    written_ms: int = 0

    def to_bytes(self) -> bytes:
        doc = {"format": FORMAT, "written_ms": self.written_ms, "baseline_ms": self.baseline_ms,
               "baseline_kind": self.baseline_kind, "last_full_ms": self.last_full_ms, "beyond": self.beyond,
               "found": [{"violation": c.violation.to_json(), "detected_ms": c.detected_ms, "found_by": c.found_by}
                         for c in self.found]}
        return zlib.compress(json.dumps(doc, separators=(",", ":")).encode())

    @classmethod
    def parse(cls, data: bytes) -> KeptState:
        """A stored state; DataError saying what is wrong."""
        try:
            doc: Any = json.loads(zlib.decompress(data))
            if doc.get("format") != FORMAT:
                raise ValueError(f"not format {FORMAT}")
            found = tuple(Current(Violation.from_json(f["violation"]), int(f["detected_ms"]), str(f["found_by"]))
                          for f in doc["found"])
            return cls(found, {str(c): int(n) for c, n in dict(doc["beyond"]).items()}, int(doc["baseline_ms"]),
                       str(doc["baseline_kind"]), int(doc["last_full_ms"]), int(doc["written_ms"]))
        except (zlib.error, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise DataError(f"the kept current state: {exc}") from None


CURRENT_STATE: LeaderRecord[KeptState | None] = LeaderRecord(
    "current-state", KeptState.parse, lambda kept: kept.to_bytes() if kept is not None else b"", lambda: None,
    "a new leader shows the last full run's counts until its own full run")


def kept(current: CurrentState, most: int = MOST, most_bytes: int = MOST_BYTES) -> KeptState:
    """The state as it can be kept: the worst findings whole, as many as fit, the others counted."""
    found, (baseline_ms, baseline_kind, last_full_ms) = current.findings(), current.baseline()
    while True:
        beyond = Counter(str(c.violation.category) for c in found[most:])
        state = KeptState(tuple(found[:most]), dict(beyond), baseline_ms, baseline_kind, last_full_ms, now_ms())
        if most == 0 or len(state.to_bytes()) <= most_bytes:
            return state
        most //= 2


class StateKeeper:
    """Writes the current state for the next leader when it changed since the last write (the leader's
    scheduler calls `keep` every few seconds), and restores a kept one on election."""

    def __init__(self, current: CurrentState) -> None:
        self.current = current
        self._written = -1  # the state's version last written

    def keep(self, store: RecordStore) -> None:
        version = self.current.version
        if version == self._written:
            return
        try:
            CURRENT_STATE.write(store, kept(self.current))
            self._written = version
        except Exception as exc:  # the next call tries again; only a failover meanwhile would show less
            log.warning("could not keep the current state for the next leader: %s", one_line(exc))

    def restore(self, store: RecordStore) -> list[int]:
        """On election: the state the last leader kept, if any (this auditor's own, from before it was deposed,
        is no fresher); the ledgers of its findings, to look at again."""
        try:
            state = CURRENT_STATE.read(store)
        except Exception as exc:  # the store away: the takeover full run tells
            log.error("cannot read the kept current state: %s", one_line(exc))
            return []
        if state is None:
            return []
        self.current.restore(state.found, state.beyond, state.baseline_ms, state.baseline_kind, state.last_full_ms)
        self._written = self.current.version
        log.info("restored the current state the last leader kept (written %d ms ago): %d findings, %d more "
                 "counted", now_ms() - state.written_ms, len(state.found), sum(state.beyond.values()))
        return sorted({c.violation.ledger_id for c in state.found})
