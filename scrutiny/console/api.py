"""The console's JSON API (/api/v1/): it asks the auditor exactly what the Auditor RPC asks it, with the same
rules; the state-changing and costly calls (rescan, what-if) are the auditor's to authenticate."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from scrutiny.auditor.face import RunSummary, Ticket, status_json
from scrutiny.console import display
from scrutiny.console.asking import MAX_LEDGER_ID, Asking, HttpError, WebApi, body_of, ledger_id_of, page_of
from scrutiny.console.ledgerview import ledger_view, metadata_json
from scrutiny.console.scopeview import scope_of, scope_view
from scrutiny.console.topicview import topic_name_of, topic_view
from scrutiny.errors import RequestError
from scrutiny.httpserver import Request, Response


class ConsoleApi(Asking):
    def __init__(self, api: WebApi, max_wait_seconds: float) -> None:
        super().__init__(api)
        self.max_wait_seconds = max_wait_seconds

    def api_status(self, req: Request) -> Response:
        return json_response(200, status_json(self.api.auditor.status()))

    def api_current(self, req: Request) -> Response:
        """The current state: the last full run's findings, plus those continuous scrutiny found since, less
        those a later look cleared, each with `detected_at` and `found_by`."""
        order = req.query.get("order", "worst")
        if order not in ("worst", "newest"):
            raise HttpError(400, "order must be worst or newest")
        limit = req.query.get("limit", "1000")
        if not limit.isdigit() or not 1 <= int(limit) <= 10_000:
            raise HttpError(400, "limit must be 1 .. 10000")
        doc = self.api.auditor.current_state(int(limit), order == "newest")
        checked = bool(self.api.auditor.current.baseline_ms)
        v = display.verdict((c.violation for c in self.api.auditor.current.findings()), checked)
        verdict = {"level": v.level, "words": v.words, "by_severity": v.by_severity}
        return json_response(200, {**doc, "verdict": verdict})

    def api_report(self, req: Request) -> Response:
        _, run = self.run(req)
        if isinstance(run, RunSummary):
            return json_response(200, run.report_json())
        doc = run.to_json(violations=False)
        if not ({"category", "topic", "bookie", "rack", "page", "page_size"} & req.query.keys()):
            return json_response(200, {**doc, "violations": [run.finding_json(v) for v in run.violations]})
        total, found = self.filtered(req, run)
        page, size = page_of(req)
        return json_response(200, {**doc, "total": total, "page": page, "page_size": size,
                           "violations": [run.finding_json(v) for v in found]})

    def api_ledger(self, req: Request) -> Response:
        view = ledger_view(self.api, ledger_id_of(req.path), ask=req.query.get("ask") == "1")
        md = view["metadata"]
        return json_response(200, {**view, "metadata": metadata_json(md) if md else None,
                           "segments": [dataclasses.asdict(seg) for seg in view["segments"]]})

    def api_topic(self, req: Request) -> Response:
        return json_response(200, topic_view(self.api, topic_name_of(req.query.get("name", ""))))

    def api_scope(self, kind: str) -> Callable[[Request], Response]:
        """GET /api/v1/tenants?name=T, /api/v1/namespaces?name=T/NS."""
        return lambda req: json_response(200, scope_view(self.api, scope_of(kind, req.query.get("name", ""))))

    def api_blast(self, req: Request) -> Response:
        _, run = self.run(req)
        if run.blast_radius is None:
            raise HttpError(404, "that run computed no blast radius (full runs do, with blast_radius: true)")
        return json_response(200, run.blast_radius)

    def api_bookies(self, req: Request) -> Response:
        return json_response(200, {"bookies": [bookie_json(r) for r in self.bookie_rows()]})

    def api_history(self, req: Request) -> Response:
        return json_response(200, {"runs": [vars(p) for p in self.api.cluster.run_history()]})

    def api_handoffs(self, req: Request) -> Response:
        """The hand-off's journal (`auditor.repair`): each ledger marked for autorecovery (or that would be, in a
        dry run, or was not and why), by whom, when, why; the newest first."""
        h = self.api.auditor.handoff
        return json_response(200, {"repair": h.mode, "handoffs": [x.to_json() for x in h.handed()]})

    def api_rescan(self, req: Request) -> Response:
        body = body_of(req)
        wait = bool(body.get("wait", False))
        if body.get("all_ledgers") is True:
            ticket, queued = self.api.auditor.rescan(None, "")
        elif isinstance(body.get("ledgers"), list) and all(type(i) is int for i in body["ledgers"]):
            if any(not 0 <= i <= MAX_LEDGER_ID for i in body["ledgers"]):
                raise RequestError("ledgers: ledger ids are 0 .. 2^63-1")
            ticket, queued = self.api.auditor.rescan(list(body["ledgers"]), "")
        elif isinstance(body.get("bookie_id"), str) and body["bookie_id"].strip():
            ticket, queued = self.api.auditor.rescan(None, body["bookie_id"].strip())
        else:
            raise RequestError('say what to rescan: {"all_ledgers": true}, {"ledgers": [ids]} or {"bookie_id": id}')
        return self._ticket(ticket, queued, wait)

    def api_whatif(self, req: Request) -> Response:
        body = body_of(req)
        bookies, racks = body.get("bookie_ids", []), body.get("racks", [])
        if not (isinstance(bookies, list) and isinstance(racks, list)
                and all(isinstance(x, str) for x in [*bookies, *racks])):
            raise RequestError("bookie_ids and racks are lists of names")
        bookies, racks = [b.strip() for b in bookies if b.strip()], [r.strip() for r in racks if r.strip()]
        if not bookies and not racks:
            raise RequestError("say which bookie_ids or racks would be down")
        ticket, queued = self.api.auditor.whatif(bookies, racks)
        return self._ticket(ticket, queued, bool(body.get("wait", False)))

    def _ticket(self, ticket: Ticket, queued: bool, wait: bool) -> Response:
        doc: dict[str, Any] = {"run_id": ticket.run_id, "queued": queued}
        if wait:
            if not ticket.done.wait(self.max_wait_seconds) or ticket.report is None:
                return json_response(202, {**doc, "error": "still going; GET /api/v1/report?kind=... serves it later"})
            doc["report"] = ticket.report.to_json()
        return json_response(200 if wait else 202, doc)


def json_response(status: int, doc: Any) -> Response:
    return Response(status, "application/json", json.dumps(doc).encode())


def bookie_json(r: display.BookieRow) -> dict[str, Any]:
    return {**{k: v for k, v in vars(r).items() if k != "findings"}, "findings": dict(r.findings)}
