"""A short history of the runs, kept by the leading auditor in the store beside the last runs (so a new
leader goes on drawing it): per complete whole-cluster run, its kind, when it finished, how long it took,
the ledgers it checked and its findings (ledgers) per category. Bounded: the newest KEPT of each kind."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from typing import Any

from scrutiny.categories import Category, known_counts
from scrutiny.errors import DataError, one_line
from scrutiny.records import LeaderRecord
from scrutiny.store import MetadataStore

log = logging.getLogger(__name__)
FORMAT = 1
KEPT = 120  # per kind: four months of daily full runs, two hours of minutely marks' runs


@dataclass(frozen=True)
class RunPoint:
    kind: str
    run_id: str
    finished_ms: int
    duration_ms: int
    ledgers_checked: int
    counts: dict[Category, int] = field(default_factory=dict)  # only the categories found


def appended(points: list[RunPoint], point: RunPoint, kept: int = KEPT) -> list[RunPoint]:
    """The history with this run, the oldest of its kind dropped beyond `kept`; oldest first."""
    same = [p for p in points if p.kind == point.kind and p.run_id != point.run_id]
    others = [p for p in points if p.kind != point.kind]
    return sorted([*others, *same[-(kept - 1):], point] if kept > 1 else [*others, point],
                  key=lambda p: p.finished_ms)


def to_bytes(points: list[RunPoint]) -> bytes:
    return json.dumps({"format": FORMAT, "runs": [asdict(p) for p in points]}, separators=(",", ":")).encode()


def parse(data: bytes) -> list[RunPoint]:
    """The stored history; DataError saying what is wrong."""
    try:
        doc = json.loads(data)
        if doc.get("format") != FORMAT:
            raise ValueError(f"not format {FORMAT}")
        return [RunPoint(str(r["kind"]), str(r["run_id"]), int(r["finished_ms"]), int(r["duration_ms"]),
                         int(r["ledgers_checked"]),
                         known_counts({str(c): int(n) for c, n in dict(r["counts"]).items()}))
                for r in doc["runs"]]
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise DataError(f"the stored run history: {exc}") from None


HISTORY = LeaderRecord("run-history", parse, to_bytes, list, "the chart starts again with the next run")


def read(store: MetadataStore) -> list[RunPoint]:
    return HISTORY.read(store)


def record(store: MetadataStore, point: RunPoint) -> None:
    try:
        HISTORY.write(store, appended(HISTORY.read(store), point))
    except Exception as exc:  # the chart misses one point; the runs and their gauges are right
        log.warning("could not record run %s in the history: %s", point.run_id, one_line(exc))


def point_of(kind: str, report: Any, finished_ms: int, duration_ms: int) -> RunPoint:
    return RunPoint(kind, report.run_id, finished_ms, duration_ms, int(report.ledgers.get("checked", 0)),
                    {c: n for c, n in report.counts.items() if n})
