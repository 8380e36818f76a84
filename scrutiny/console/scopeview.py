"""A Pulsar tenant or namespace as the console tells it, the way its operator thinks of it: each of its topics
with the ledgers its record needs and the bytes the record says they store, what is at risk now, and its leaked
ledgers with the bytes their bookies still hold. What is at risk is the current state's (the last whole-cluster
runs' findings and continuous scrutiny's since); a topic whose record is gone still shows while a finding names
one of its ledgers (a leak, most often)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from scrutiny.auditor.face import CurrentState
from scrutiny.categories import SEVERITIES, Category, severity_of
from scrutiny.checks import Violation
from scrutiny.console import display
from scrutiny.console.asking import HttpError, WebApi
from scrutiny.console.ledgerview import finding_row
from scrutiny.errors import MetadataError
from scrutiny.pulsar.owners import topic_of_owner
from scrutiny.pulsar.scope import Scope
from scrutiny.pulsar.snapshot import PulsarRecord

SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}


def scope_of(kind: str, given: str) -> Scope:
    """The `name` a request gives (400 when it is not a tenant's or a namespace's)."""
    try:
        return Scope.of(kind, given)
    except MetadataError as exc:
        raise HttpError(400, f"name: {exc}") from None


@dataclass
class TopicRow:
    topic: str
    recorded: bool = False  # its record is in Pulsar's metadata store now
    ledgers: set[int] = field(default_factory=set)  # those its record needs (data, cursors, compacted, schema)
    entries: int = 0  # of its closed data ledgers, as the record gives them
    bytes_stored: int = 0  # ... and their bytes
    found: list[Violation] = field(default_factory=list)  # on its ledgers, now

    def to_json(self) -> dict[str, Any]:
        leaked = [v for v in self.found if v.category is Category.LEAKED_LEDGER]
        return {"topic": self.topic, "recorded": self.recorded, "ledgers": len(self.ledgers), "entries": self.entries,
                "bytes_stored": self.bytes_stored, "ledgers_at_risk": at_risk(self.found),
                "categories": dict(Counter(str(v.category) for v in self.found)),
                "leaked": sorted(v.ledger_id for v in leaked),
                "leaked_bytes": sum(int(v.details.get("bytes", 0)) for v in leaked)}


def at_risk(found: list[Violation]) -> dict[str, int]:
    """Severity -> the ledgers with a finding of it (none: not there)."""
    out = {s: len({v.ledger_id for v in found if severity_of(v.category, v.details) == s}) for s in SEVERITIES}
    return {s: n for s, n in out.items() if n}


def topic_rows(record: PulsarRecord) -> dict[str, TopicRow]:
    """Each topic the record names, with the ledgers it needs and what it says they store."""
    topics: dict[str, TopicRow] = {}
    for need in record.needs():
        topic = topic_of_owner(need.owner)  # a schema's: the topic its id names (partitions share it)
        row = topics.setdefault(topic, TopicRow(topic))
        row.ledgers.add(need.ledger_id)
        if need.kind == "data" and need.entries is not None:
            row.entries += need.entries
            row.bytes_stored += need.size or 0
    for t in record.topics.values():
        topics.setdefault(t.topic, TopicRow(t.topic)).recorded = True
    return topics


def scope_view(api: WebApi, scope: Scope) -> dict[str, Any]:
    """Its topics, worst first (then by name), their totals, and every finding on them now (404: no topic of
    theirs has a record and no finding names one)."""
    record = api.cluster.topics_in(scope)
    topics = topic_rows(record)
    current: CurrentState = api.auditor.current
    found = [(c, topic_of_owner(owner)) for c in current.findings()
             if scope.owns(owner := c.violation.owner) and owner is not None]
    for c, topic in found:
        topics.setdefault(topic, TopicRow(topic)).found.append(c.violation)
    if not topics:
        raise HttpError(404, f"no such {scope.kind}: {scope.name} has no topic in Pulsar's metadata store, and no "
                             "finding names one")
    rows = sorted((t.to_json() for t in topics.values()), key=_worst_first)
    verdict = display.verdict((c.violation for c, _ in found), bool(current.baseline_ms))
    findings = [{**finding_row(c.violation, c, current.repair), "topic": topic} for c, topic in found]
    return {scope.kind: scope.name, "topics": rows, "problems": list(record.problems),
            "verdict": {"level": verdict.level, "words": verdict.words, "by_severity": verdict.by_severity},
            "totals": {"topics": sum(r["recorded"] for r in rows), "ledgers": sum(r["ledgers"] for r in rows),
                       "entries": sum(r["entries"] for r in rows), "bytes_stored": sum(r["bytes_stored"] for r in rows),
                       "ledgers_at_risk": at_risk([c.violation for c, _ in found]),
                       "leaked_ledgers": sum(len(r["leaked"]) for r in rows),
                       "leaked_bytes": sum(r["leaked_bytes"] for r in rows)},
            "findings": sorted(findings, key=lambda f: (SEVERITY_RANK[f["severity"]], f["topic"], f["ledger_id"]))}


def _worst_first(row: dict[str, Any]) -> tuple[int, int, str]:
    worst = min((SEVERITY_RANK[s] for s in row["ledgers_at_risk"]), default=len(SEVERITY_RANK))
    return worst, -sum(row["ledgers_at_risk"].values()), row["topic"]
