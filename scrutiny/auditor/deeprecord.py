"""The deep pass's cursor as the leaders keep it in the store."""

from __future__ import annotations

import logging
import time

from scrutiny.auditor.runqueue import Ticket
from scrutiny.config import AuditorSettings
from scrutiny.deeppass import DeepPass, slices_for
from scrutiny.errors import DataError, one_line
from scrutiny.report import Report
from scrutiny.store import MetadataStore

log = logging.getLogger(__name__)


def deep_pass(store: MetadataStore, s: AuditorSettings) -> DeepPass:
    """The stored deep-pass cursor, fitted to the configured pass (a fresh one when none or unreadable)."""
    slices = slices_for(s.deep_pass_days * 86400, s.deep_interval_seconds)
    data = store.deep_pass()
    try:
        return DeepPass.parse(data).resized(slices) if data else DeepPass.fresh(slices, int(time.time() * 1000))
    except DataError as exc:
        log.error("%s: starting a new deep pass", exc)
        return DeepPass.fresh(slices, int(time.time() * 1000))


def record_deep_run(store: MetadataStore, s: AuditorSettings, ticket: Ticket, report: Report) -> None:
    """The slice is verified: the cursor moves on, in the store, and the report says where the pass is."""
    try:
        cursor = deep_pass(store, s)
        if cursor.next_slice == ticket.deep_slice:  # else the pass was resized meanwhile: nothing to record
            cursor = cursor.after_run(ticket.deep_slice, ticket.started_ms)
            store.set_deep_pass(cursor.to_bytes())
        report.stats.update(cursor.stats())
    except Exception as exc:  # the next run verifies this slice again: late, never lost
        log.warning("could not record the deep pass: %s", one_line(exc))

