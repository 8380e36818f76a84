"""A Pulsar topic as the console tells it: every ledger its record names (data, cursors, compacted, schema
versions), what BookKeeper's metadata says of each now, whether it is healthy, at fault or missing, and
every finding about the topic (its leaked ledgers among them: named by no record, so only findings know)."""

from __future__ import annotations

from typing import Any

from scrutiny.auditor.face import KINDS
from scrutiny.categories import REGISTRY
from scrutiny.console.asking import HttpError, WebApi
from scrutiny.console.ledgerview import finding_row
from scrutiny.errors import MetadataError
from scrutiny.metadata import LedgerState
from scrutiny.pulsar.owners import topic_of_owner
from scrutiny.pulsar.records import managed_ledger_of, schema_id_of
from scrutiny.pulsar.snapshot import Need
from scrutiny.report import Report
from scrutiny.store import LedgerRead


def topic_name_of(given: str) -> str:
    """The `name` a request gives, as a persistent topic's full name (400 when it is none)."""
    name = given if given.startswith("persistent://") else f"persistent://{given}"
    try:
        managed_ledger_of(name)
    except MetadataError as exc:
        raise HttpError(400, f"name: {exc}") from None
    return name


def topic_view(api: WebApi, topic: str) -> dict[str, Any]:
    """Its ledgers in the record's order with BookKeeper's word on each, and its findings (404: no record and
    no finding names it)."""
    record, reads = api.cluster.topic(topic)
    found = record.topic(topic)
    schema = record.schema_of(topic)
    findings = []
    for kind in KINDS:
        run = api.auditor.last_run(kind)
        if isinstance(run, Report):
            for owner in (topic, schema_id_of(topic)):
                findings += [{**finding_row(v, repair=run.repair), "run": f"{kind} {run.run_id}"}
                             for v in run.violations.worst(10 * len(REGISTRY), topic=owner)[1]]
    current = [finding_row(c.violation, c, api.auditor.current.repair) for c in api.auditor.current.findings()
               if c.violation.owner is not None and topic_of_owner(c.violation.owner) == topic]
    if found is None and schema is None and not findings and not current:
        raise HttpError(404, f"no such topic: {topic} has no record in Pulsar's metadata store, and no finding "
                             "names it")
    faulty = {f["ledger_id"] for f in findings + current}
    ledgers = [ledger_row(n, reads.get(n.ledger_id), faulty) for n in record.needs()]
    offloaded = [li.ledger_id for li in found.managed_ledger.ledgers if li.gone_on_purpose] if found else []
    validated = api.cluster.messages(topic)
    statuses = [row["status"] for row in ledgers]
    return {"topic": topic, "managed_ledger": found.managed_ledger.name if found else None,
            "cursors": sorted(found.cursors) if found else [], "schema_id": schema.schema_id if schema else None,
            "ledgers": ledgers, "offloaded": offloaded, "problems": list(record.problems),
            "counts": {s: statuses.count(s) for s in dict.fromkeys(statuses)}, "current": current,
            "findings": findings, "leaked": sorted({f["ledger_id"] for f in findings + current
                                                    if f["category"] == "LEAKED_LEDGER"}),
            "messages": {"validated_through": str(validated.position) if validated.position else None,
                         "producers": len(validated.producers), "statistics": dict(sorted(validated.stats.items()))}}


def ledger_row(need: Need, read: LedgerRead | None, faulty: set[int]) -> dict[str, Any]:
    """One ledger the record names: what for, what the record says of it, BookKeeper's metadata, its status."""
    md = read.metadata if read is not None else None
    what = {"data": "the topic's entries", "cursor": f"subscription {need.cursor}'s positions",
            "compacted": "the compacted topic", "schema": f"schema version {need.version}"}[need.kind]
    if md is None:
        status = "at fault" if read is not None and read.error else "missing"
    elif need.ledger_id in faulty:
        status = "at fault"
    else:
        status = "open" if md.state is not LedgerState.CLOSED else "healthy"
    return {"ledger_id": need.ledger_id, "kind": need.kind, "what": what, "record_entries": need.entries,
            "record_size": need.size, "state": md.state.name if md is not None else None,
            "entries": md.last_entry_id + 1 if md is not None and md.state is LedgerState.CLOSED else None,
            "error": read.error if read is not None else None, "status": status}
