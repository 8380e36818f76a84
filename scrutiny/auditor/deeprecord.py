"""The deep pass's cursor as the leaders keep it in the store."""

from __future__ import annotations

import logging

from scrutiny.auditor.runqueue import Ticket
from scrutiny.config import AuditorSettings
from scrutiny.deeppass import DeepPass, slices_for
from scrutiny.errors import one_line
from scrutiny.records import LeaderRecord
from scrutiny.report import Report
from scrutiny.store import MetadataStore
from scrutiny.times import now_ms

log = logging.getLogger(__name__)


DEEP_PASS: LeaderRecord[DeepPass | None] = LeaderRecord(
    "deep-pass", DeepPass.parse, lambda cursor: cursor.to_bytes() if cursor is not None else b"", lambda: None,
    "a new deep pass starts")


def deep_pass(store: MetadataStore, s: AuditorSettings) -> DeepPass:
    """The stored deep-pass cursor, fitted to the configured pass (a fresh one when none or unreadable)."""
    slices = slices_for(s.deep_pass_days * 86400, s.deep_interval_seconds)
    stored = DEEP_PASS.read(store)
    return stored.resized(slices) if stored is not None else DeepPass.fresh(slices, now_ms())


def record_deep_run(store: MetadataStore, s: AuditorSettings, ticket: Ticket, report: Report) -> None:
    """The slice is verified: the cursor moves on, in the store, and the report says where the pass is."""
    try:
        cursor = deep_pass(store, s)
        if cursor.next_slice == ticket.deep_slice:  # else the pass was resized meanwhile: nothing to record
            cursor = cursor.after_run(ticket.deep_slice, ticket.started_ms)
            DEEP_PASS.write(store, cursor)
        report.stats.update(cursor.stats())
    except Exception as exc:  # the next run verifies this slice again: late, never lost
        log.warning("could not record the deep pass: %s", one_line(exc))

