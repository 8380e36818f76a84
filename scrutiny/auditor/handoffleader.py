"""The auditor as the hand-off's leader (`scrutiny.repair.handoff.Leader`): its settings as reloaded, its current
findings, its store and election, its address in the journal; from the few parts of the auditor that hold them."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Protocol

from scrutiny.auditor.currentstate import FOLLOW_UP, CurrentState
from scrutiny.auditor.leadership import Leadership
from scrutiny.auditor.runkinds import CHECKED_BY_RUNS
from scrutiny.checks import Violation
from scrutiny.config import AuditorSettings, ScanSettings
from scrutiny.store import Fence, MetadataStore


class Settings(Protocol):
    @property
    def scan(self) -> ScanSettings: ...

    @property
    def auditor(self) -> AuditorSettings: ...


class Parts(Protocol):
    """What of the auditor the hand-off's leader uses."""

    current: CurrentState
    stopping: threading.Event

    @property
    def config(self) -> Settings: ...  # as reloaded

    @property
    def address(self) -> str: ...

    @property
    def leadership(self) -> Leadership | None: ...

    def connected_store(self) -> MetadataStore: ...


class AuditorLeader:
    def __init__(self, auditor: Parts) -> None:
        self.auditor = auditor
        self.stopping: threading.Event = auditor.stopping

    def settings(self) -> tuple[ScanSettings, AuditorSettings]:
        return self.auditor.config.scan, self.auditor.config.auditor

    def findings(self) -> Iterable[Violation]:
        return (c.violation for c in self.auditor.current.findings())

    def store(self) -> MetadataStore:
        return self.auditor.connected_store()

    def leading(self) -> bool:
        return self.auditor.leadership is not None and self.auditor.leadership.leading.is_set()

    def fence(self) -> Fence | None:
        return self.auditor.leadership.fence() if self.auditor.leadership is not None else None

    def name(self) -> str:
        return self.auditor.address

    def looked_again(self, ledger_ids: list[int], found: list[Violation]) -> None:
        self.auditor.current.looked_again(ledger_ids, found, int(time.time() * 1000), "repair follow-up",
                                          (*CHECKED_BY_RUNS, *FOLLOW_UP))
