"""The last complete run of each kind, as a small record that outlives the auditor that made it.

Alerts read the gauges of the last complete run. A new leader (a failover, a rolling restart) would
export nothing until its own next full run, up to a day later, and `ScrutinyDataAtRisk` would resolve
while the data is still at risk. So after each complete whole-cluster run the leader writes this summary
beside the cadence in the metadata store, and whoever leads next exports it at once with its true age.
It holds what the sinks export (per-category counts, the unavailable bookies, the blast radius, the
stats), never the per-ledger findings: those can be large and stay in the report files.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from scrutiny.categories import Category, known_counts
from scrutiny.errors import DataError, one_line
from scrutiny.records import LeaderRecord
from scrutiny.report import Report
from scrutiny.store import MetadataStore
from scrutiny.times import iso_seconds

log = logging.getLogger(__name__)
FORMAT = 1


@dataclass(frozen=True)
class RunSummary:
    kind: str
    run_id: str
    started_at: str  # ISO-8601 UTC, as in the report
    finished_ms: int  # epoch ms: the age the gauges export
    duration_ms: int
    counts: dict[Category, int]  # ledgers per category, for the categories the run looked at
    ledgers: dict[str, int] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)
    unavailable: dict[str, int] = field(default_factory=dict)  # bookie -> ledgers it left unchecked
    slow: tuple[str, ...] = ()  # those of them that answered their health check: overloaded, not down
    blast_radius: dict[str, dict[str, dict[str, int]]] | None = None
    ran_by: str = ""  # the auditor that ran it
    orphans: dict[str, dict[str, int]] = field(default_factory=dict)  # bookie -> ledgers, entries, bytes held
    lost: dict[str, dict[str, int]] = field(default_factory=dict)  # lost bookie -> its unmarked ledgers, below AQ

    @classmethod
    def of(cls, kind: str, report: Report, finished_ms: int, duration_ms: int, categories: tuple[Category, ...],
           ran_by: str = "") -> RunSummary:
        counts = report.counts
        unavailable: Counter[str] = Counter()
        down: set[str] = set()
        if Category.BOOKIE_UNAVAILABLE in categories:
            for v in report.violations.of_category(Category.BOOKIE_UNAVAILABLE):
                unavailable.update(v.bookies)
                silence = v.details.get("silence", {})
                down.update(b for b in v.bookies if silence.get(b) != "slow")
        orphans: dict[str, Counter[str]] = {}
        if Category.ORPHAN_LEDGER in categories:
            for v in report.violations.of_category(Category.ORPHAN_LEDGER):
                for b, held in v.details.get("held_by", {}).items():
                    orphans.setdefault(b, Counter()).update(ledgers=1, **held)
        lost: dict[str, Counter[str]] = {}
        if Category.LOST_BOOKIE_RECOVERY_NOT_STARTED in categories:
            for v in report.violations.of_category(Category.LOST_BOOKIE_RECOVERY_NOT_STARTED):
                for b in v.bookies:
                    lost.setdefault(b, Counter()).update(ledgers=1, below_aq=int(bool(v.details["below_ack_quorum"])))
        return cls(kind, report.run_id, report.started_at, finished_ms, duration_ms,
                   {c: counts[c] for c in categories}, dict(report.ledgers), dict(report.stats),
                   dict(sorted(unavailable.items())), tuple(sorted(set(unavailable) - down)), report.blast_radius,
                   ran_by, {b: dict(n) for b, n in sorted(orphans.items())},
                   {b: {"ledgers": n["ledgers"], "below_aq": n["below_aq"]} for b, n in sorted(lost.items())})

    @property
    def finished_at(self) -> str:
        return iso_seconds(self.finished_ms / 1000)

    def looked_at(self, category: Category) -> bool:
        return category in self.counts

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "kind": self.kind, "run_id": self.run_id, "started_at": self.started_at,
                "finished_ms": self.finished_ms, "duration_ms": self.duration_ms, "ran_by": self.ran_by,
                "counts": self.counts, "ledgers": self.ledgers, "stats": self.stats,
                "unavailable": self.unavailable, "slow": list(self.slow), "blast_radius": self.blast_radius,
                "orphans": self.orphans, "lost": self.lost}

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def parse(cls, data: bytes, where: str) -> RunSummary:
        """A stored summary; DataError naming `where` and what is wrong otherwise."""
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DataError(f"{where}: not JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise DataError(f"{where}: not a JSON object")
        if doc.get("format") != FORMAT:
            raise DataError(f"{where}: format {doc.get('format')!r}, this auditor reads format {FORMAT}")
        try:
            return cls(_str(doc, "kind"), _str(doc, "run_id"), _str(doc, "started_at"), _int(doc, "finished_ms"),
                       _int(doc, "duration_ms"), known_counts(_ints(doc, "counts")), _ints(doc, "ledgers"),
                       _ints(doc, "stats"), _ints(doc, "unavailable"), _strs(doc, "slow"),
                       _blast(doc.get("blast_radius")), _str(doc, "ran_by"), _per_bookie(doc.get("orphans", {})),
                       _per_bookie(doc.get("lost", {})))
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"{where}: {exc}") from None

    def report_json(self) -> dict[str, Any]:
        """The report of the contract as far as the summary knows it: counts, stats and blast radius,
        no per-ledger findings (`summary_only`), and which auditor ran it."""
        return {"run_id": self.run_id, "started_at": self.started_at,
                "finished_at": self.finished_at, "complete": True, "summary_only": True,
                "ran_by": self.ran_by, "ledgers": self.ledgers, "counts": self.counts, "stats": self.stats,
                **({"blast_radius": self.blast_radius} if self.blast_radius is not None else {})}


def last_run(kind: str) -> LeaderRecord[RunSummary | None]:
    """The last complete run of a kind, as its leader left it for the next."""
    return LeaderRecord(f"last-run/{kind}", lambda data: RunSummary.parse(data, f"the last {kind} run"),
                        lambda summary: summary.to_bytes() if summary is not None else b"", lambda: None,
                        "the next run of its kind sets its gauges again")


def bequeath(store: MetadataStore, summary: RunSummary) -> None:
    """Beside the cadence: whoever leads next exports this run until it has one of its own."""
    try:
        last_run(summary.kind).write(store, summary)
    except Exception as exc:  # the gauges here are right; only a next leader would miss this run
        log.warning("could not record the %s run's summary for the next leader: %s", summary.kind, one_line(exc))


def inherit(store: MetadataStore, kinds: Iterable[str], own_finished_ms: Mapping[str, int]) -> Iterator[RunSummary]:
    """The stored last runs of these kinds newer than this auditor's own (an unreadable one is logged and
    skipped: the next run of its kind sets the gauges again)."""
    for kind in kinds:
        try:
            summary = last_run(kind).read(store)
        except Exception as exc:  # the store away: the next run of its kind sets the gauges again
            log.error("cannot inherit the last %s run: %s", kind, one_line(exc))
            continue
        if summary is None:
            continue
        if own_finished_ms.get(kind, -1) >= summary.finished_ms:
            continue
        log.info("inherited the last complete %s run %s (finished %s, by %s): %s", kind, summary.run_id,
                 iso_seconds(summary.finished_ms / 1000), summary.ran_by or "an unknown auditor",
                 json.dumps({c: n for c, n in summary.counts.items() if n}, sort_keys=True))
        yield summary


def _str(doc: dict[str, Any], key: str) -> str:
    value = doc[key]
    if not isinstance(value, str):
        raise TypeError(f"{key} is not a string")
    return value


def _int(doc: dict[str, Any], key: str) -> int:
    value = doc[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{key} is not a non-negative integer")
    return value


def _ints(doc: dict[str, Any], key: str) -> dict[str, int]:
    value = doc.get(key, {})
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, int) for k, v in value.items()):
        raise TypeError(f"{key} is not a map of names to integers")
    return value


def _strs(doc: dict[str, Any], key: str) -> tuple[str, ...]:
    value = doc.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"{key} is not a list of names")
    return tuple(value)


def _per_bookie(value: Any) -> dict[str, dict[str, int]]:
    if not isinstance(value, dict) or not all(
            isinstance(f, dict) and all(isinstance(n, int) for n in f.values()) for f in value.values()):
        raise TypeError("orphans or lost is not {bookie: {figure: integer}}")
    return value


def _blast(value: Any) -> dict[str, dict[str, dict[str, int]]] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(
            isinstance(per, dict) and all(isinstance(f, dict) and all(isinstance(n, int) for n in f.values())
                                          for f in per.values()) for per in value.values()):
        raise TypeError("blast_radius is not {scope: {name: {figure: integer}}}")
    return value
