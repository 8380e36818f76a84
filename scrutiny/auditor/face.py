"""The auditor as the console reads it: one narrow face (what it found, its runs and their summaries, its
hand-off, the calls it answers, who may make them) and the values it speaks in. The console imports this
module of the auditor and no other; the auditor imports nothing of the console (`main` wires the two)."""

from __future__ import annotations

from typing import Any, Protocol

from scrutiny.auditor.currentstate import CurrentState
from scrutiny.auditor.history import RunPoint
from scrutiny.auditor.history import read as run_history
from scrutiny.auditor.lastrun import RunSummary
from scrutiny.auditor.runkinds import KINDS
from scrutiny.auditor.runqueue import Ticket
from scrutiny.auditor.service import Authenticator, Status, status_json
from scrutiny.config import AuditorSettings, ScanSettings
from scrutiny.repair.handoff import Handoff
from scrutiny.report import Report
from scrutiny.store import MetadataStore

__all__ = ["KINDS", "AuditorFace", "Authenticator", "CurrentState", "Handoff", "RunPoint", "RunSummary", "Status",
           "Ticket", "run_history", "status_json"]


class AuditorFace(Protocol):
    current: CurrentState
    handoff: Handoff

    def rescan(self, ledger_ids: list[int] | None, bookie_id: str) -> tuple[Ticket, bool]: ...

    def whatif(self, bookie_ids: list[str], racks: list[str]) -> tuple[Ticket, bool]: ...

    def status(self) -> Status: ...

    def last_run(self, kind: str) -> Report | RunSummary | None: ...

    def current_state(self, most: int = 1000, newest_first: bool = False) -> dict[str, Any]: ...

    def connected_store(self) -> MetadataStore: ...

    def scan_settings(self) -> ScanSettings: ...  # as reloaded

    def auditor_settings(self) -> AuditorSettings: ...

    def authenticator(self) -> Authenticator: ...  # the RPC's rule for who may call what, the console's too
