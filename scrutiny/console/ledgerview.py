"""A ledger as the console tells it: its metadata, what each of its bookies holds of it now, every finding
about it, and whether it is healthy, not checked yet or unknown; and a finding as the pages draw it."""

from __future__ import annotations

from typing import Any

from scrutiny.auditor.face import KINDS, RunSummary
from scrutiny.categories import REGISTRY, severity_of, spec
from scrutiny.checks import Violation
from scrutiny.checks.remedy import RepairContext, remedy
from scrutiny.console import display
from scrutiny.console.asking import HttpError, WebApi
from scrutiny.errors import ScrutinyError, one_line
from scrutiny.metadata import LedgerMetadata, LedgerState
from scrutiny.pulsar.owners import owner_from_custom_metadata
from scrutiny.report import Report
from scrutiny.store import LedgerRead
from scrutiny.times import iso, ms_of


def ledger_view(api: WebApi, ledger_id: int, ask: bool) -> dict[str, Any]:
    """Its metadata, what each bookie holds of it now (`ask`), every finding about it, and whether it is
    healthy, not checked yet or unknown (404)."""
    read = api.cluster.ledger(ledger_id)
    findings = []
    for kind in KINDS:
        run = api.auditor.last_run(kind)
        if isinstance(run, Report):
            findings += [{**finding_row(v, repair=run.repair), "run": f"{kind} {run.run_id}"}
                         for v in run.violations.worst(len(REGISTRY), ledger_id=ledger_id)[1]]
    current = [finding_row(c.violation, c, api.auditor.current.repair) for c in api.auditor.current.findings()
               if c.violation.ledger_id == ledger_id]
    md = read.metadata
    if md is None and read.error is None and not findings and not current:
        raise HttpError(404, f"no such ledger: {ledger_id} is not in the metadata, and no finding names it")
    full = api.auditor.last_run("full")
    state, why = checked_state(md, read, full, findings or current)
    segments: list[display.SegmentView] = []
    asked = ""
    if md is not None and md.state is LedgerState.CLOSED and ask:
        try:
            registered, _ = api.cluster.bookies_now()
            segments = display.copies(md, api.cluster.ask_bookies(md), registered.keys())
        except ScrutinyError as exc:
            asked = f"could not ask the bookies now: {one_line(exc)}"
    # the owner its own metadata names (Pulsar's keys), whether or not some finding names it
    own = owner_from_custom_metadata(md.custom_metadata) if md is not None else None
    owner = (own.name or own.kind) if own is not None else next((f["owner"] for f in findings + current
                                                                 if f["owner"]), "")
    return {"ledger_id": ledger_id, "checked": state, "why": why, "metadata": md, "error": read.error,
            "segments": segments, "asked": asked, "findings": findings, "current": current, "owner": owner}


def finding_row(v: Violation, current: Any = None, repair: RepairContext | None = None) -> dict[str, Any]:
    """One finding as the templates draw it, with its remedy under `repair` (the run's, or the last full run's
    for the current state's)."""
    owner = v.owner.name if v.owner and v.owner.name else (v.owner.kind if v.owner else "")
    return {"ledger_id": v.ledger_id, "category": str(v.category), "severity": severity_of(v.category, v.details),
            "owner": owner, "topic": v.owner.name if v.owner and v.owner.kind == "topic" else "",
            "bookies": v.bookies, "lines": spec(v.category).describe(v.details),
            "detected_at": iso(current.detected_ms) if current is not None else "",
            "found_by": current.found_by if current is not None else "",
            "remedy": remedy(v, repair or RepairContext()).to_json()}


def checked_state(md: LedgerMetadata | None, read: LedgerRead, full: Report | RunSummary | None,
             found: list[Any]) -> tuple[str, str]:
    """healthy | at fault | not checked yet | not in the metadata, and why."""
    if md is None:
        if read.error is not None:
            return "at fault", f"its metadata cannot be decoded: {read.error}"
        return "not in the metadata", "deleted from the metadata; a bookie still holds it (see the findings)"
    if found:
        return "at fault", "findings below"
    if md.state is not LedgerState.CLOSED:
        return "not checked yet", (f"{md.state.name.lower().replace('_', ' ')}: copies are checked once the ledger "
                                   "is closed (its durability policy is checked while it is written)")
    if md.last_entry_id < 0:
        return "healthy", "closed empty: nothing to hold (any entry a bookie holds past the close would be a finding)"
    if full is None:
        return "not checked yet", "no complete full run yet"
    started = ms_of(full.started_at)
    if md.modified_ms >= 0 and md.modified_ms >= started:
        return "not checked yet", (f"its metadata changed at {iso(md.modified_ms)}, after the last full run "
                                   f"started ({full.started_at}); continuous scrutiny looks once the write cache "
                                   "has flushed, the next full run in any case")
    if md.modified_ms < 0:
        return "healthy", (f"no finding in the last full run ({full.finished_at}); this store keeps no "
                           "modification times, so a change since then may not have been looked at yet")
    return "healthy", f"no finding in the last full run ({full.finished_at}) nor since"


def metadata_json(md: LedgerMetadata) -> dict[str, Any]:
    return {"state": md.state.name, "ensemble_size": md.ensemble_size, "write_quorum": md.write_quorum,
            "ack_quorum": md.ack_quorum, "last_entry_id": md.last_entry_id, "length": md.length,
            "ctime": iso(md.ctime) if md.ctime > 0 else None, "format_version": md.format_version,
            "segments": [{"first_entry_id": s.first_entry_id, "ensemble": list(s.ensemble)} for s in md.segments]}
