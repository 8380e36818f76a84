"""The auditor's page and HTTP API, on the port that serves /metrics: where an operator goes when an
alert fires ("which topics, which ledgers, which bookies, since when"), in a browser or with curl.

Server-rendered HTML without scripts or external assets (it works in a cluster without internet):
sorting, filtering and paging are links and a form. The JSON under /api/v1/ asks the auditor exactly
what the Auditor RPC asks it (`AuditorApi`), with the same rules: the state-changing and costly calls
(rescan, what-if) need the bearer token; reading is open unless `status_requires_auth`.
"""

from __future__ import annotations

import html
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import grpc

from scrutiny.auditor.lastrun import RunSummary
from scrutiny.auditor.runqueue import Ticket
from scrutiny.auditor.service import KINDS, Authenticator, Status
from scrutiny.categories import CATEGORY_NAMES, REGISTRY, Category, spec, worst_first
from scrutiny.checks import Violation
from scrutiny.errors import NotLeader, RequestError, ScrutinyError, one_line
from scrutiny.prometheus import Request, Response
from scrutiny.report import Report

HTTP_STATUS = {grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.UNAUTHENTICATED: 401,
               grpc.StatusCode.NOT_FOUND: 404, grpc.StatusCode.FAILED_PRECONDITION: 409,
               grpc.StatusCode.RESOURCE_EXHAUSTED: 429, grpc.StatusCode.UNAVAILABLE: 503}
MAX_PAGE_SIZE = 1000
BLAST_COLUMNS = ("ledgers_below_aq", "ledgers_without_a_copy", "topics_below_aq", "topics_without_a_copy")


class WebApi(Protocol):
    def rescan(self, ledger_ids: list[int] | None, bookie_id: str) -> tuple[Ticket, bool]: ...

    def whatif(self, bookie_ids: list[str], racks: list[str]) -> tuple[Ticket, bool]: ...

    def status(self) -> Status: ...

    def last_run(self, kind: str) -> Report | RunSummary | None: ...

    def current_state(self, most: int = 1000, newest_first: bool = False) -> dict[str, Any]: ...


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class AuditorWeb:
    """The application `MetricsEndpoint` serves beside /metrics."""

    def __init__(self, api: WebApi, auth: Authenticator, reads_need_token: bool, max_wait_seconds: float) -> None:
        self.api, self.auth = api, auth
        self.reads_need_token, self.max_wait_seconds = reads_need_token, max_wait_seconds

    def __call__(self, req: Request) -> Response | None:
        routes: dict[tuple[str, str], Callable[[Request], Response]] = {
            ("GET", "/"): self.page_status, ("GET", "/findings"): self.page_findings,
            ("GET", "/blast-radius"): self.page_blast, ("GET", "/api/v1/status"): self.api_status,
            ("GET", "/api/v1/report"): self.api_report, ("GET", "/api/v1/current"): self.api_current,
            ("GET", "/api/v1/blast-radius"): self.api_blast,
            ("POST", "/api/v1/rescan"): self.api_rescan, ("POST", "/api/v1/whatif"): self.api_whatif}
        path = req.path.rstrip("/") or "/"
        handler = routes.get((req.method, path))
        if handler is None and req.method == "GET" and path.startswith(("/ledgers/", "/api/v1/ledgers/")):
            handler = self.api_ledger if path.startswith("/api/") else self.page_ledger
        if handler is None:
            if any(p == path for _, p in routes):
                return _json(405, {"error": f"{req.method} is not served at {path}"})
            return None
        try:
            if req.method == "POST" or self.reads_need_token:  # the pages too: they show what the API does
                self._authenticate(req)
            return handler(req)
        except HttpError as exc:
            return _json(exc.status, {"error": str(exc)}) if path.startswith("/api/") else \
                _html(exc.status, "error", f"<p class=error>{_e(str(exc))}</p>")
        except NotLeader as exc:
            return _json(409, {"error": one_line(exc), "leader_address": exc.leader})
        except ScrutinyError as exc:  # each kind of error once, as the RPC maps it to its gRPC code
            return _json(HTTP_STATUS.get(exc.grpc_code, 500), {"error": one_line(exc)})

    def _authenticate(self, req: Request) -> None:
        given = req.headers.get("Authorization") or req.headers.get("authorization") or ""
        if not self.auth.allows(given):  # no client certificates here: plain HTTP
            raise HttpError(401, "a valid bearer token is required (Authorization: Bearer <token>)"
                            if self.auth.token else "this auditor has no token_file: its HTTP API refuses this call")

    # -- what a request asks for -----------------------------------------------------------------

    def _run(self, req: Request) -> tuple[str, Report | RunSummary]:
        kind = req.query.get("kind", "full")
        if kind not in KINDS:
            raise HttpError(400, f"kind must be one of {', '.join(KINDS)}")
        run = self.api.last_run(kind)
        if run is None:
            raise HttpError(404, f"no complete {kind} run is known here yet")
        return kind, run

    @staticmethod
    def _filters(req: Request) -> dict[str, str]:
        """The request's filters of findings (category, topic, bookie), checked."""
        q = {k: req.query.get(k, "").strip() for k in ("category", "topic", "bookie")}
        if q["category"] and q["category"] not in {str(c) for c in REGISTRY}:
            raise HttpError(400, f"category {q['category']!r} is not one of scrutiny's categories")
        return q

    def _filtered(self, req: Request, run: Report | RunSummary) -> tuple[int, list[Violation]]:
        """(how many findings match the request's filters, its page of them, worst first)."""
        filters = self._filters(req)
        page, size = self._page(req)
        if isinstance(run, RunSummary):
            return 0, []
        return run.violations.worst(size, (page - 1) * size, filters["category"], filters["topic"], filters["bookie"])

    @staticmethod
    def _page(req: Request) -> tuple[int, int]:
        try:
            page, size = int(req.query.get("page", "1")), int(req.query.get("page_size", "100"))
        except ValueError:
            raise HttpError(400, "page and page_size are whole numbers") from None
        if page < 1 or not 1 <= size <= MAX_PAGE_SIZE:
            raise HttpError(400, f"page is 1 or more, page_size 1..{MAX_PAGE_SIZE}")
        return page, size

    # -- JSON ----------------------------------------------------------------------------------

    def api_status(self, req: Request) -> Response:
        return _json(200, _status_json(self.api.status()))

    def api_current(self, req: Request) -> Response:
        """The current state: the last full run's findings, plus those continuous scrutiny found since, less
        those a later look cleared, each with `detected_at` and `found_by`."""
        order = req.query.get("order", "worst")
        if order not in ("worst", "newest"):
            raise HttpError(400, "order must be worst or newest")
        limit = req.query.get("limit", "1000")
        if not limit.isdigit() or not 1 <= int(limit) <= 10_000:
            raise HttpError(400, "limit must be 1 .. 10000")
        return _json(200, self.api.current_state(int(limit), order == "newest"))

    def api_report(self, req: Request) -> Response:
        _, run = self._run(req)
        if isinstance(run, RunSummary):
            return _json(200, run.report_json())
        doc = run.to_json(violations=False)
        if not ({"category", "topic", "bookie", "page", "page_size"} & req.query.keys()):
            return _json(200, {**doc, "violations": [v.to_json() for v in run.violations]})
        total, found = self._filtered(req, run)
        page, size = self._page(req)
        return _json(200, {**doc, "total": total, "page": page, "page_size": size,
                           "violations": [v.to_json() for v in found]})

    def api_ledger(self, req: Request) -> Response:
        ledger_id = _ledger_id(req.path)
        kind, run = self._run(req)
        found = [] if isinstance(run, RunSummary) else \
            [v.to_json() for v in run.violations.worst(len(REGISTRY), ledger_id=ledger_id)[1]]
        return _json(200, {"ledger_id": ledger_id, "kind": kind, "run_id": run.run_id, "findings": found})

    def api_blast(self, req: Request) -> Response:
        _, run = self._run(req)
        if run.blast_radius is None:
            raise HttpError(404, "that run computed no blast radius (full runs do, with blast_radius: true)")
        return _json(200, run.blast_radius)

    def api_rescan(self, req: Request) -> Response:
        body = _body(req)
        wait = bool(body.get("wait", False))
        if body.get("all_ledgers") is True:
            ticket, queued = self.api.rescan(None, "")
        elif isinstance(body.get("ledgers"), list) and all(isinstance(i, int) for i in body["ledgers"]):
            ticket, queued = self.api.rescan(list(body["ledgers"]), "")
        elif isinstance(body.get("bookie_id"), str) and body["bookie_id"].strip():
            ticket, queued = self.api.rescan(None, body["bookie_id"].strip())
        else:
            raise RequestError('say what to rescan: {"all_ledgers": true}, {"ledgers": [ids]} or {"bookie_id": id}')
        return self._ticket(ticket, queued, wait)

    def api_whatif(self, req: Request) -> Response:
        body = _body(req)
        bookies, racks = body.get("bookie_ids", []), body.get("racks", [])
        if not (isinstance(bookies, list) and isinstance(racks, list)
                and all(isinstance(x, str) for x in [*bookies, *racks])):
            raise RequestError("bookie_ids and racks are lists of names")
        bookies, racks = [b.strip() for b in bookies if b.strip()], [r.strip() for r in racks if r.strip()]
        if not bookies and not racks:
            raise RequestError("say which bookie_ids or racks would be down")
        ticket, queued = self.api.whatif(bookies, racks)
        return self._ticket(ticket, queued, bool(body.get("wait", False)))

    def _ticket(self, ticket: Ticket, queued: bool, wait: bool) -> Response:
        doc: dict[str, Any] = {"run_id": ticket.run_id, "queued": queued}
        if wait:
            if not ticket.done.wait(self.max_wait_seconds) or ticket.report is None:
                return _json(202, {**doc, "error": "still going; GET /api/v1/report?kind=... serves it later"})
            doc["report"] = ticket.report.to_json()
        return _json(200 if wait else 202, doc)

    # -- HTML ----------------------------------------------------------------------------------

    def page_status(self, req: Request) -> Response:
        s = self.api.status()
        parts = []
        if s.leading:
            parts.append("<p class=ok>This auditor <b>leads</b>.</p>")
        else:
            leader = s.leader_address.rsplit(":", 1)[0] if s.leader_address else ""
            link = f' <a href="http://{_e(leader)}:{_e(req.headers.get("Host", ":").rsplit(":", 1)[-1])}/">its page' \
                   "</a> (this page's port on its host)" if leader else ""
            parts.append(f"<p class=warn>This auditor is a <b>standby</b>. The leader: "
                         f"{_e(s.leader_address or 'unknown')}.{link}</p>")
        if s.current is not None:
            c = s.current
            parts.append(f"<p>Running: {_e(c.kind)} run {_e(c.run_id)}, {c.ranges_done} of {c.ranges_total or '?'} "
                         "ranges.</p>")
        if s.leading:
            parts.append(_continuous_html(self.api.current_state(most=10, newest_first=True)))
        rows = []
        for kind in KINDS:
            run = self.api.last_run(kind)
            if run is None:
                continue
            bad = {c: n for c, n in run.counts.items() if n}
            age = _age(run)
            by = f" (by {_e(run.ran_by)})" if isinstance(run, RunSummary) else ""
            rows.append(f"<tr><td><a href='/findings?kind={kind}'>{kind}</a></td><td>{_e(run.run_id)}{by}</td>"
                        f"<td>{_e(run.finished_at)}</td><td>{age}</td><td>"
                        + ", ".join(f"<a href='/findings?kind={kind}&category={c}'>{c}</a> {n}" for c, n in
                                    sorted(bad.items(), key=lambda cn: spec(Category(cn[0])).rank
                                           if cn[0] in CATEGORY_NAMES else 99))
                        + ("none" if not bad else "") + "</td></tr>")
        parts.append("<h2>Last complete runs</h2>" + (
            "<table><tr><th>kind</th><th>run</th><th>finished</th><th>age</th><th>findings (ledgers)</th></tr>"
            + "".join(rows) + "</table>" if rows else "<p>No complete run yet.</p>"))
        deep = self.api.last_run("deep")
        if deep is not None and "deep_pass_slices" in deep.stats:
            st = deep.stats
            parts.append(f"<h2>Deep pass</h2><p>{st['deep_pass_progress_permille'] / 10:.1f}% of the current pass "
                         f"({st['deep_pass_next_slice']} of {st['deep_pass_slices']} slices), "
                         f"{st.get('deep_passes_completed', 0)} passes completed; oldest verification "
                         f"{_duration(time.time() - st['deep_oldest_verified_ms'] / 1000)} ago.</p>")
        parts.append("<p><a href='/blast-radius'>Blast radius</a>: which bookie or rack can go down now. "
                     "<a href='/metrics'>/metrics</a>. JSON: <a href='/api/v1/status'>/api/v1/status</a>.</p>")
        return _html(200, "scrutiny auditor", "".join(parts))

    def page_findings(self, req: Request) -> Response:
        kind, run = self._run(req)
        if isinstance(run, RunSummary):
            return _html(200, f"{kind} findings", f"<p>The last {kind} run ({_e(run.run_id)}) was made by "
                         f"{_e(run.ran_by)}, before this auditor led: its per-ledger findings are in that auditor's "
                         "reports_dir and on its page. Counts: " + _e(json.dumps(
                             {c: n for c, n in run.counts.items() if n})) + "</p>")
        total, found = self._filtered(req, run)
        page, size = self._page(req)
        q = self._filters(req)
        form = (f"<form method=get action='/findings'><input type=hidden name=kind value='{kind}'>"
                "category <select name=category id=category><option value=''>any</option>"
                + "".join(f"<option{' selected' if q['category'] == str(c) else ''}>{c}</option>"
                          for c in worst_first())
                + f"</select> topic <input name=topic id=topic value='{_e(q['topic'])}' size=40>"
                f" bookie <input name=bookie id=bookie value='{_e(q['bookie'])}'>"
                " <button type=submit id=filter>filter</button></form>")
        topics = "".join(f"<tr><td>{_e(t or '(unknown owner)')}</td><td>{c}</td><td>{n}</td></tr>"
                         for t, c, n in run.violations.per_topic(50, **q))
        rows = "".join(_finding_row(v) for v in found)
        pages = -(-total // size)
        nav = " ".join(f"<a href='{_e(_link('/findings', {**req.query, 'page': str(p)}))}'>{p}</a>"
                       if p != page else f"<b>{p}</b>" for p in range(1, min(pages, 50) + 1))
        body = (f"<p>{kind} run {_e(run.run_id)}, finished {_e(run.finished_at)}: {total} findings"
                f"{' (filtered)' if any(q.values()) else ''}. <a href='/'>back</a></p>{form}"
                "<h2>By topic</h2><table id=topics><tr><th>topic</th><th>category</th><th>ledgers</th></tr>"
                f"{topics}</table><h2>Ledgers, worst first</h2><table id=findings><tr><th>ledger</th>"
                f"<th>category</th><th>owner</th><th>bookies</th><th>details</th></tr>{rows}</table><p>{nav}</p>")
        return _html(200, f"{kind} findings", body)

    def page_ledger(self, req: Request) -> Response:
        ledger_id = _ledger_id(req.path)
        rows = []
        for kind in KINDS:
            run = self.api.last_run(kind)
            if isinstance(run, Report):
                rows += [_finding_row(v, kind) for v in run.violations.worst(len(REGISTRY), ledger_id=ledger_id)[1]]
        body = (f"<p><a href='/'>back</a></p><table><tr><th>ledger</th><th>category</th><th>owner</th><th>bookies</th>"
                f"<th>details</th><th>run</th></tr>{''.join(rows)}</table>" if rows
                else "<p>No finding on this ledger in the last runs known here.</p>")
        return _html(200, f"ledger {ledger_id}", body)

    def page_blast(self, req: Request) -> Response:
        _, run = self._run(req)
        if run.blast_radius is None:
            raise HttpError(404, "the last run computed no blast radius")
        scope = req.query.get("scope", "bookies")
        sort = req.query.get("sort", "ledgers_below_aq")
        if scope not in ("bookies", "racks") or sort not in (*BLAST_COLUMNS, "name"):
            raise HttpError(400, f"scope is bookies or racks; sort is name or one of {', '.join(BLAST_COLUMNS)}")
        descending = req.query.get("order", "desc") != "asc"
        entries = list(run.blast_radius.get(scope, {}).items())
        entries.sort(key=lambda e: e[0] if sort == "name" else (e[1].get(sort, 0), e[0]), reverse=descending)
        head = "".join(
            f"<th><a id='sort-{c}' href='{_e(_link('/blast-radius', {**req.query, 'sort': c, 'order': 'asc' if sort == c and descending else 'desc'}))}'>{c}</a></th>"  # noqa: E501
            for c in ("name", *BLAST_COLUMNS))
        rows = "".join(f"<tr><td><a href='/findings?bookie={_e(name)}'>{_e(name)}</a></td>"
                       + "".join(f"<td>{figures.get(c, 0)}</td>" for c in BLAST_COLUMNS) + "</tr>"
                       for name, figures in entries)
        other = "racks" if scope == "bookies" else "bookies"
        body = (f"<p>Were this {scope[:-1]} alone down: ledgers (and topics) that would fall below their ack quorum, "
                "or lose every copy of an entry. Zero everywhere, or not listed: safe to take it down now. "
                f"Run {_e(run.run_id)}, "
                f"{_age(run)} old. <a href='/blast-radius?scope={other}'>{other}</a> <a href='/'>back</a></p>"
                f"<table id=blast><tr>{head}</tr>{rows}</table>")
        return _html(200, f"blast radius per {scope[:-1]}", body)


STYLE = ("body{font:14px sans-serif;margin:1.5em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
         "padding:3px 8px;text-align:left;vertical-align:top}.ok{color:#060}.warn{color:#a50}.error{color:#b00}"
         "small{color:#555}")


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _html(status: int, title: str, body: str) -> Response:
    page = (f"<!doctype html><html><head><meta charset=utf-8><title>{_e(title)}</title><style>{STYLE}</style>"
            f"</head><body><h1>{_e(title)}</h1>{body}</body></html>")
    return Response(status, "text/html; charset=utf-8", page.encode())


def _continuous_html(state: dict[str, Any]) -> str:
    """The status page's view of the current state: its counts, its newest findings, how it is watched."""
    if not state["continuous"]:
        return "<h2>Now</h2><p>Continuous scrutiny is off (auditor.continuous): only runs look.</p>"
    feeds = Counter(state["feeds"].values())
    watching = (f"watching every change since {_e(state['watching_since'])}" if state["watching_since"]
                else "<span class=warn>not watching</span>")
    counts = ", ".join(f"<a href='/findings?category={_e(c)}'>{_e(c)}</a> {n}" for c, n in
                       sorted(state["counts"].items())) or "none"
    newest = "".join(f"<li>{_e(v['detected_at'])}: {_e(v['category'])} on <a href='/ledgers/{v['ledger_id']}'>"
                     f"ledger {v['ledger_id']}</a> ({_e(v['found_by'])})</li>" for v in state["violations"])
    return (f"<h2>Now</h2><p>Continuous scrutiny: {watching}; feeds "
            + ", ".join(f"{n} {_e(st)}" for st, n in sorted(feeds.items())) + f"; {state['missed']} missed "
            f"(found by a full run first). Findings now (ledgers): {counts}. "
            "JSON: <a href='/api/v1/current'>/api/v1/current</a>.</p>" + (f"<ul>{newest}</ul>" if newest else ""))


def _json(status: int, doc: Any) -> Response:
    return Response(status, "application/json", json.dumps(doc).encode())


def _link(path: str, query: dict[str, str]) -> str:
    from urllib.parse import urlencode

    return f"{path}?{urlencode({k: v for k, v in query.items() if v})}"


def _body(req: Request) -> dict[str, Any]:
    try:
        doc = json.loads(req.body or b"{}")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HttpError(400, f"the body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise HttpError(400, "the body is a JSON object")
    return doc


def _ledger_id(path: str) -> int:
    text = path.rstrip("/").rsplit("/", 1)[-1]
    if not text.isdigit():
        raise HttpError(400, f"{text!r} is not a ledger id")
    return int(text)


def _finding_row(v: Violation, run: str = "") -> str:
    owner = v.owner.name if v.owner and v.owner.name else (v.owner.kind if v.owner else "")
    lines = spec(v.category).describe(v.details)
    return (f"<tr class=finding><td><a href='/ledgers/{v.ledger_id}'>{v.ledger_id}</a></td><td>{v.category}</td>"
            f"<td>{_e(owner)}</td><td>{_e(', '.join(v.bookies))}</td><td><small>{'<br>'.join(map(_e, lines))}"
            f"</small></td>{f'<td>{_e(run)}</td>' if run else ''}</tr>")


def _age(run: Report | RunSummary) -> str:
    from datetime import datetime

    try:
        finished = datetime.fromisoformat(run.finished_at.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return "?"
    return _duration(time.time() - finished)


def _duration(seconds: float) -> str:
    s = int(max(0, seconds))
    return f"{s // 86400}d {s % 86400 // 3600}h" if s >= 86400 else f"{s // 3600}h {s % 3600 // 60}m" \
        if s >= 3600 else f"{s // 60}m {s % 60}s"


def _status_json(s: Status) -> dict[str, Any]:
    def ticket(t: Ticket) -> dict[str, Any]:
        return {"run_id": t.run_id, "kind": t.kind, "ranges_done": t.ranges_done, "ranges_total": t.ranges_total,
                "complete": bool(t.report and t.report.complete),
                **({"started_at": t.report.started_at, "finished_at": t.report.finished_at,
                    "counts": t.report.counts} if t.report else {})}

    inherited: Iterable[dict[str, Any]] = ({k: v for k, v in i.report_json().items()
                                            if k in ("run_id", "started_at", "finished_at", "counts", "ran_by")}
                                           | {"kind": i.kind, "complete": True} for i in s.inherited)
    return {"role": "leader" if s.leading else "standby", "leader_address": s.leader_address,
            "current_run": ticket(s.current) if s.current else None,
            "last_runs": [ticket(t) for t in s.own_last()] + list(inherited),
            "next_runs": dict(s.next_runs), "skipped_runs": dict(s.skipped), "queued_runs": s.queued_runs,
            "runs_awaiting_recheck": s.runs_awaiting_recheck}
