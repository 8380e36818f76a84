"""What a request to the console asks for, checked: the run (its kind), the findings' filters and page, a
ledger id, a JSON body; and the lookups the pages and the API share. Bad input is an HttpError (a 4xx)
saying what was wrong."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from scrutiny.auditor.face import KINDS, AuditorFace, RunSummary
from scrutiny.categories import REGISTRY
from scrutiny.checks import Violation
from scrutiny.console import display
from scrutiny.console.clusterview import ClusterView
from scrutiny.httpserver import Request
from scrutiny.report import Report

MAX_PAGE_SIZE = 1000
MAX_PAGE = 2**31 - 1  # (page - 1) * page_size stays within SQLite's 64-bit integers
MAX_LEDGER_ID = 2**63 - 1  # BookKeeper's ledger ids are Java longs, never negative


class WebApi:
    """What the console reads: the auditor, through its face, and the cluster live."""

    def __init__(self, auditor: AuditorFace) -> None:
        self.auditor = auditor
        self.cluster = ClusterView(auditor.connected_store, auditor.scan_settings)


class HttpError(Exception):
    def __init__(self, status: int, message: str, allow: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.status, self.allow = status, allow



class Asking:
    """The lookups a request makes of the auditor (`api`: what the RPC asks too)."""

    def __init__(self, api: WebApi) -> None:
        self.api = api

    def run(self, req: Request) -> tuple[str, Report | RunSummary]:
        kind = req.query.get("kind", "full")
        if kind not in KINDS:
            raise HttpError(400, f"kind must be one of {', '.join(KINDS)}")
        run = self.api.auditor.last_run(kind)
        if run is None:
            raise HttpError(404, f"no complete {kind} run is known here yet")
        return kind, run

    def filters(self, req: Request) -> dict[str, Any]:
        """The request's filters of findings (category, topic, bookie, or a rack's bookies), checked."""
        q: dict[str, Any] = {k: req.query.get(k, "").strip() for k in ("category", "topic", "bookie")}
        if q["category"] and q["category"] not in {str(c) for c in REGISTRY}:
            raise HttpError(400, f"category {q['category']!r} is not one of scrutiny's categories")
        rack = req.query.get("rack", "").strip()
        if rack:
            if q["bookie"]:
                raise HttpError(400, "say bookie or rack, not both")
            _, racks = self.api.cluster.bookies_now()
            q["bookie"] = tuple(sorted(b for b, r in racks.items() if r == known_rack(rack, racks)))
        return q

    def filtered(self, req: Request, run: Report | RunSummary) -> tuple[int, list[Violation]]:
        """(how many findings match the request's filters, its page of them, worst first)."""
        filters = self.filters(req)
        page, size = page_of(req)
        if isinstance(run, RunSummary):
            return 0, []
        return run.violations.worst(size, (page - 1) * size, filters["category"], filters["topic"], filters["bookie"])

    def dependencies(self) -> tuple[dict[str, dict[str, int]] | None, str]:
        """The last full run's figures per bookie (what depends on it), and when it finished."""
        run = self.api.auditor.last_run("full")
        if run is None:
            return None, ""
        return (run.blast_radius or {}).get("bookies"), run.finished_at

    def bookie_rows(self) -> list[display.BookieRow]:
        registered, racks = self.api.cluster.bookies_now()
        depends, finished = self.dependencies()
        feeds = self.api.auditor.current_state(most=0)["feeds"]
        found = [c.violation for c in self.api.auditor.current.findings()]
        return display.bookie_rows(registered, racks, depends, found, feeds, finished)


def known_rack(rack: str, racks: Mapping[str, str]) -> str:
    """A rack asked for by name, as one of the racks bookies are on (bookie -> rack); 400 otherwise."""
    if rack not in racks.values():
        known = sorted({r for r in racks.values() if r})
        raise HttpError(400, f"no bookie is on rack {rack!r} (the racks: {', '.join(known) or 'none known'})")
    return rack


def link(path: str, query: dict[str, str]) -> str:
    return f"{path}?{urlencode({k: v for k, v in query.items() if v})}"


def page_of(req: Request) -> tuple[int, int]:
    try:
        page, size = int(req.query.get("page", "1")), int(req.query.get("page_size", "100"))
    except ValueError:
        raise HttpError(400, "page and page_size are whole numbers") from None
    if not 1 <= page <= MAX_PAGE or not 1 <= size <= MAX_PAGE_SIZE:
        raise HttpError(400, f"page is 1 or more (at most {MAX_PAGE}), page_size 1..{MAX_PAGE_SIZE}")
    return page, size


def body_of(req: Request) -> dict[str, Any]:
    try:
        doc = json.loads(req.body or b"{}")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HttpError(400, f"the body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise HttpError(400, "the body is a JSON object")
    return doc


def ledger_id_of(path: str) -> int:
    text = path.rstrip("/").rsplit("/", 1)[-1]
    if not text.isdigit():
        raise HttpError(400, f"{text!r} is not a ledger id")
    if len(text) > 19 or int(text) > MAX_LEDGER_ID:
        raise HttpError(400, f"{text} is not a ledger id: ledger ids are 0 .. 2^63-1")
    return int(text)
