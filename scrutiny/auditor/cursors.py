"""Where continuous scrutiny is in each agent's change feed and in the store's watch, as the leaders keep it:
a new leader goes on from there (an unreadable record: every feed followed from now, after a full run)."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from scrutiny.errors import DataError
from scrutiny.records import LeaderRecord
from scrutiny.store import MetadataStore

log = logging.getLogger(__name__)
FORMAT = 1


@dataclass(frozen=True)
class Cursors:
    agents: Mapping[str, tuple[str, int]] = field(default_factory=dict)  # bookie -> (feed id, last sequence)
    metadata: str = ""  # where the store's watch can resume ("" where the store cannot)

    def to_bytes(self) -> bytes:
        return json.dumps({"format": FORMAT, "metadata": self.metadata,
                           "agents": {b: {"feed_id": f, "sequence": n}
                                      for b, (f, n) in sorted(self.agents.items())}}).encode()


def parse_cursors(data: bytes) -> Cursors:
    """The stored cursors; DataError saying what is wrong otherwise."""
    try:
        doc = json.loads(data)
        if doc.get("format") != FORMAT:
            raise ValueError(f"not format {FORMAT}")
        agents = {str(b): (str(c["feed_id"]), int(c["sequence"])) for b, c in doc["agents"].items()}
        return Cursors(agents, str(doc.get("metadata", "")))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise DataError(f"the stored continuous-scrutiny cursors: {exc}") from None


CURSORS = LeaderRecord("continuous-cursors", parse_cursors, Cursors.to_bytes, Cursors,
                       "every feed is followed from now, after a full run")


class KeptCursors:
    """The cursors as last read from the store or recorded there; recorded again only when they moved."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.recorded = Cursors()

    def read(self, store: MetadataStore) -> Cursors:
        with self._lock:
            self.recorded = CURSORS.read(store)
            return self.recorded

    def record(self, store: MetadataStore, cursors: Cursors) -> None:
        with self._lock:
            if cursors == self.recorded:
                return
            try:
                CURSORS.write(store, cursors)
                self.recorded = cursors
            except Exception as exc:  # kept next time; a new leader meanwhile re-reads a little more
                log.info("continuous scrutiny: cannot record the cursors now: %s", exc)
