"""The operator's console and HTTP API, on the port that serves /metrics: where an operator goes when an
alert fires ("is data at risk, which topics, which ledgers, which bookies, since when"), in a browser or
with curl.

Server-rendered HTML from Jinja2 templates (autoescaped: a topic or bookie name is never markup), without
scripts or external assets (it works in a cluster without internet); the pictures are inline SVG. Sorting,
filtering and paging are links and a form. The JSON under /api/v1/ asks the auditor exactly what the
Auditor RPC asks it, with the same rules: the state-changing and costly calls (rescan, what-if) need the
bearer token or a verified client certificate; reading is open unless `status_requires_auth`. Every
refusal is a 4xx with a JSON body saying what was wrong (HTML to a browser on the pages).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol
from urllib.parse import urlencode

import grpc
import jinja2

from scrutiny.auditor import console
from scrutiny.auditor.clusterview import ClusterView
from scrutiny.auditor.currentstate import CurrentState
from scrutiny.auditor.lastrun import RunSummary
from scrutiny.auditor.runqueue import Ticket
from scrutiny.auditor.service import KINDS, Authenticator, Status
from scrutiny.categories import CATEGORY_NAMES, REGISTRY, SEVERITIES, Category, severity_of, spec, worst_first
from scrutiny.checks import Violation
from scrutiny.errors import NotLeader, RequestError, ScrutinyError, one_line
from scrutiny.httpserver import Request, Response, json_error
from scrutiny.metadata import LedgerMetadata, LedgerState
from scrutiny.owners import owner_from_custom_metadata
from scrutiny.report import Report
from scrutiny.store import LedgerRead
from scrutiny.times import in_words, iso, ms_of

HTTP_STATUS = {grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.UNAUTHENTICATED: 401,
               grpc.StatusCode.NOT_FOUND: 404, grpc.StatusCode.FAILED_PRECONDITION: 409,
               grpc.StatusCode.RESOURCE_EXHAUSTED: 429, grpc.StatusCode.UNAVAILABLE: 503}
MAX_PAGE_SIZE = 1000
MAX_PAGE = 2**31 - 1  # (page - 1) * page_size stays within SQLite's 64-bit integers
MAX_LEDGER_ID = 2**63 - 1  # BookKeeper's ledger ids are Java longs, never negative
BLAST_COLUMNS = ("ledgers_below_aq", "ledgers_without_a_copy", "topics_below_aq", "topics_without_a_copy")
REFRESH_SECONDS = 60
CSV_COLUMNS = ("ledger_id", "category", "severity", "owner_kind", "owner", "bookies", "details")

TEMPLATES = jinja2.Environment(loader=jinja2.PackageLoader("scrutiny.auditor", "templates"),
                               autoescape=jinja2.select_autoescape(default=True), undefined=jinja2.StrictUndefined,
                               trim_blocks=True, lstrip_blocks=True)


class WebApi(Protocol):
    current: CurrentState
    cluster: ClusterView

    def rescan(self, ledger_ids: list[int] | None, bookie_id: str) -> tuple[Ticket, bool]: ...

    def whatif(self, bookie_ids: list[str], racks: list[str]) -> tuple[Ticket, bool]: ...

    def status(self) -> Status: ...

    def last_run(self, kind: str) -> Report | RunSummary | None: ...

    def current_state(self, most: int = 1000, newest_first: bool = False) -> dict[str, Any]: ...



class HttpError(Exception):
    def __init__(self, status: int, message: str, allow: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.status, self.allow = status, allow


class AuditorWeb:
    """The application `HttpServer` serves beside /metrics."""

    def __init__(self, api: WebApi, auth: Authenticator, reads_need_token: bool, max_wait_seconds: float) -> None:
        self.api, self.auth = api, auth
        self.reads_need_token, self.max_wait_seconds = reads_need_token, max_wait_seconds
        self.routes: dict[tuple[str, str], Callable[[Request], Response]] = {
            ("GET", "/"): self.page_home, ("GET", "/findings"): self.page_findings,
            ("GET", "/findings.csv"): self.export_csv, ("GET", "/bookies"): self.page_bookies,
            ("GET", "/blast-radius"): self.page_blast, ("GET", "/api/v1/status"): self.api_status,
            ("GET", "/api/v1/report"): self.api_report, ("GET", "/api/v1/current"): self.api_current,
            ("GET", "/api/v1/blast-radius"): self.api_blast, ("GET", "/api/v1/bookies"): self.api_bookies,
            ("GET", "/api/v1/history"): self.api_history,
            ("POST", "/api/v1/rescan"): self.api_rescan, ("POST", "/api/v1/whatif"): self.api_whatif}

    def __call__(self, req: Request) -> Response | None:
        path = req.path.rstrip("/") or "/"
        handler = self.routes.get((req.method, path))
        if handler is None and req.method == "GET" and path.startswith(("/ledgers/", "/api/v1/ledgers/")):
            handler = self.api_ledger if path.startswith("/api/") else self.page_ledger
        page = not path.startswith("/api/")
        try:
            if handler is None:
                allow = self.methods(path)
                if allow:
                    raise HttpError(405, f"{req.method} is not served at {path} (only {', '.join(allow)})", allow)
                if path.startswith("/api/") or path == "/ledgers":
                    raise HttpError(404, f"no such call: {path} (the API: /api/v1/status, report, current, "
                                         "ledgers/<id>, bookies, history, blast-radius; POST rescan, whatif)")
                return None
            if req.method == "POST" or self.reads_need_token:  # the pages too: they show what the API does
                self._authenticate(req)
            return handler(req)
        except HttpError as exc:
            return self._refusal(req, page, exc.status, str(exc), exc.allow)
        except NotLeader as exc:
            return _json(409, {"error": one_line(exc), "leader_address": exc.leader})
        except ScrutinyError as exc:  # each kind of error once, as the RPC maps it to its gRPC code
            return self._refusal(req, page, HTTP_STATUS.get(exc.grpc_code, 500), one_line(exc))

    def methods(self, path: str) -> tuple[str, ...]:
        """The methods a path serves (GET with HEAD), none for a path that is not one of the routes."""
        served = {m for m, p in self.routes if p == path}
        if path.startswith(("/ledgers/", "/api/v1/ledgers/")):
            served.add("GET")
        return tuple(m for m in ("GET", "HEAD", "POST") if m in served or (m == "HEAD" and "GET" in served))

    def _refusal(self, req: Request, page: bool, status: int, message: str, allow: tuple[str, ...] = ()) -> Response:
        if page and req.wants_html():
            got = _html(status, "error", "error", message=message, http_status=status)
            return Response(got.status, got.content_type, got.body, (("Allow", ", ".join(allow)),) if allow else ())
        return json_error(status, message, allow)

    def _authenticate(self, req: Request) -> None:
        given = req.headers.get("Authorization") or req.headers.get("authorization") or ""
        if not self.auth.allows(given, req.client_verified):
            raise HttpError(401, "a valid bearer token is required (Authorization: Bearer <token>)"
                            if self.auth.token or self.auth.client_ca
                            else "this auditor has no token_file: its HTTP API refuses this call")

    # -- what a request asks for -----------------------------------------------------------------

    def _run(self, req: Request) -> tuple[str, Report | RunSummary]:
        kind = req.query.get("kind", "full")
        if kind not in KINDS:
            raise HttpError(400, f"kind must be one of {', '.join(KINDS)}")
        run = self.api.last_run(kind)
        if run is None:
            raise HttpError(404, f"no complete {kind} run is known here yet")
        return kind, run

    def _filters(self, req: Request) -> dict[str, Any]:
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

    def _filtered(self, req: Request, run: Report | RunSummary) -> tuple[int, list[Violation]]:
        """(how many findings match the request's filters, its page of them, worst first)."""
        filters = self._filters(req)
        page, size = _page(req)
        if isinstance(run, RunSummary):
            return 0, []
        return run.violations.worst(size, (page - 1) * size, filters["category"], filters["topic"], filters["bookie"])

    def _dependencies(self) -> tuple[dict[str, dict[str, int]] | None, str]:
        """The last full run's figures per bookie (what depends on it), and when it finished."""
        run = self.api.last_run("full")
        if run is None:
            return None, ""
        return (run.blast_radius or {}).get("bookies"), run.finished_at

    def _bookie_rows(self) -> list[console.BookieRow]:
        registered, racks = self.api.cluster.bookies_now()
        depends, finished = self._dependencies()
        feeds = self.api.current_state(most=0)["feeds"]
        return console.bookie_rows(registered, racks, depends, [c.violation for c in self.api.current.findings()],
                                   feeds, finished)

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
        doc = self.api.current_state(int(limit), order == "newest")
        checked = bool(self.api.current.baseline_ms)
        v = console.verdict((c.violation for c in self.api.current.findings()), checked)
        return _json(200, {**doc, "verdict": {"level": v.level, "words": v.words, "by_severity": v.by_severity}})

    def api_report(self, req: Request) -> Response:
        _, run = self._run(req)
        if isinstance(run, RunSummary):
            return _json(200, run.report_json())
        doc = run.to_json(violations=False)
        if not ({"category", "topic", "bookie", "rack", "page", "page_size"} & req.query.keys()):
            return _json(200, {**doc, "violations": [v.to_json() for v in run.violations]})
        total, found = self._filtered(req, run)
        page, size = _page(req)
        return _json(200, {**doc, "total": total, "page": page, "page_size": size,
                           "violations": [v.to_json() for v in found]})

    def api_ledger(self, req: Request) -> Response:
        view = ledger_view(self.api, _ledger_id(req.path), ask=req.query.get("ask") == "1")
        md = view["metadata"]
        return _json(200, {**view, "metadata": _metadata_json(md) if md else None,
                           "segments": [dataclasses.asdict(seg) for seg in view["segments"]]})

    def api_blast(self, req: Request) -> Response:
        _, run = self._run(req)
        if run.blast_radius is None:
            raise HttpError(404, "that run computed no blast radius (full runs do, with blast_radius: true)")
        return _json(200, run.blast_radius)

    def api_bookies(self, req: Request) -> Response:
        return _json(200, {"bookies": [_bookie_json(r) for r in self._bookie_rows()]})

    def api_history(self, req: Request) -> Response:
        return _json(200, {"runs": [vars(p) for p in self.api.cluster.run_history()]})

    def api_rescan(self, req: Request) -> Response:
        body = _body(req)
        wait = bool(body.get("wait", False))
        if body.get("all_ledgers") is True:
            ticket, queued = self.api.rescan(None, "")
        elif isinstance(body.get("ledgers"), list) and all(type(i) is int for i in body["ledgers"]):
            if any(not 0 <= i <= MAX_LEDGER_ID for i in body["ledgers"]):
                raise RequestError("ledgers: ledger ids are 0 .. 2^63-1")
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

    def page_home(self, req: Request) -> Response:
        s = self.api.status()
        state = self.api.current
        found = state.findings()
        runs = []
        for kind in KINDS:
            run = self.api.last_run(kind)
            if run is not None:
                runs.append({"kind": kind, "run": run, "age": _age(run), "summary": isinstance(run, RunSummary),
                             "duration": _run_duration(run), "bad": _worst_counts(run.counts)})
        full = self.api.last_run("full")
        checked = bool(state.baseline_ms) or full is not None
        verdict = console.verdict((c.violation for c in found) if state.baseline_ms else
                                  (full.violations if isinstance(full, Report) else []), checked,
                                  not isinstance(full, Report) or full.complete)
        since = state.previous_full_ms
        history = self.api.cluster.run_history()
        now = self.api.current_state(most=10, newest_first=True) if s.leading else None
        feeds = sorted(Counter(now["feeds"].values()).items()) if now else []
        return _html(200, "home", "scrutiny", status=s, leader_link=_leader_link(s, req), verdict=verdict, runs=runs,
                     now=now, feeds=feeds, baseline_kind=state.baseline_kind or "full",
                     new=[_row(c.violation, c) for c in found if c.detected_ms > since][:50] if since else [],
                     resolved=state.resolved(since)[:50] if since else [], since=iso(since) if since else "",
                     chart=console.chart(history), deep=_deep(self.api.last_run("deep")),
                     recent=[p for p in history if p.kind in console.WHOLE_RUNS][-5:][::-1], refresh=REFRESH_SECONDS)

    def page_findings(self, req: Request) -> Response:
        kind, run = self._run(req)
        q = self._filters(req)
        if isinstance(run, RunSummary):
            return _html(200, "findings", f"{kind} findings", summary=run, kind=kind, q=q)
        total, found = self._filtered(req, run)
        page, size = _page(req)
        pages = -(-total // size)
        nav = [(p, _link("/findings", {**req.query, "page": str(p)})) for p in range(1, min(pages, 50) + 1)]
        detected = {(c.violation.category, c.violation.ledger_id): c for c in self.api.current.findings()}
        query = {k: v for k, v in req.query.items() if k not in ("page", "page_size")}
        return _html(200, "findings", f"{kind} findings", kind=kind, run=run, total=total, q=q,
                     rack=req.query.get("rack", ""), categories=worst_first(),
                     rows=[_row(v, detected.get((v.category, v.ledger_id))) for v in found],
                     topics=run.violations.per_topic(50, q["category"], q["topic"], q["bookie"]), nav=nav, page=page,
                     summary=None, csv=_link("/findings.csv", query),
                     json=_link("/api/v1/report", {**query, "page_size": "1000"}))

    def export_csv(self, req: Request) -> Response:
        """Every matching finding of the run (not a page of them), one row each."""
        _, run = self._run(req)
        if isinstance(run, RunSummary):
            raise HttpError(404, "that run was made by an earlier leader: its findings are in its reports_dir")
        q = self._filters(req)
        total, _ = run.violations.worst(0, 0, q["category"], q["topic"], q["bookie"])
        _, found = run.violations.worst(total, 0, q["category"], q["topic"], q["bookie"])
        out = io.StringIO()
        w = csv.writer(out)
        w.writerow(CSV_COLUMNS)
        for v in found:
            w.writerow([v.ledger_id, v.category, severity_of(v.category, v.details), v.owner.kind if v.owner else "",
                        v.owner.name if v.owner else "", " ".join(v.bookies), json.dumps(v.details)])
        return Response(200, "text/csv; charset=utf-8", out.getvalue().encode())

    def page_ledger(self, req: Request) -> Response:
        view = ledger_view(self.api, _ledger_id(req.path), ask=True)
        return _html(200, "ledger", f"ledger {view['ledger_id']}", **view)

    def page_bookies(self, req: Request) -> Response:
        rows = self._bookie_rows()
        rack = req.query.get("rack", "").strip()
        if rack:
            rows = [r for r in rows if r.rack == known_rack(rack, {r.bookie: r.rack for r in rows})]
        racks: dict[str, list[console.BookieRow]] = {}
        for r in rows:
            racks.setdefault(r.rack or "(no rack)", []).append(r)
        _, finished = self._dependencies()
        return _html(200, "bookies", "bookies" + (f" on {rack}" if rack else ""), rows=rows,
                     racks=sorted(racks.items()), tallest=max(map(len, racks.values()), default=0), rack=rack,
                     finished=finished, states=console.STATES, refresh=REFRESH_SECONDS)

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
        head = [(c, _link("/blast-radius", {**req.query, "sort": c,
                                            "order": "asc" if sort == c and descending else "desc"}))
                for c in ("name", *BLAST_COLUMNS)]
        # its ledgers' copies unknown, the run could not count what its going down would do
        silent = [r for r in self._bookie_rows() if r.state in ("down", "slow", "unregistered")]
        return _html(200, "blast", f"blast radius per {scope[:-1]}", scope=scope,
                     other="racks" if scope == "bookies" else "bookies", run=run, age=_age(run), head=head,
                     entries=entries, columns=BLAST_COLUMNS, silent=silent)


def known_rack(rack: str, racks: Mapping[str, str]) -> str:
    """A rack asked for by name, as one of the racks bookies are on (bookie -> rack); 400 otherwise."""
    if rack not in racks.values():
        known = sorted({r for r in racks.values() if r})
        raise HttpError(400, f"no bookie is on rack {rack!r} (the racks: {', '.join(known) or 'none known'})")
    return rack


def ledger_view(api: WebApi, ledger_id: int, ask: bool) -> dict[str, Any]:
    """Its metadata, what each bookie holds of it now (`ask`), every finding about it, and whether it is
    healthy, not checked yet or unknown (404)."""
    read = api.cluster.ledger(ledger_id)
    findings = []
    for kind in KINDS:
        run = api.last_run(kind)
        if isinstance(run, Report):
            findings += [{**_row(v), "run": f"{kind} {run.run_id}"}
                         for v in run.violations.worst(len(REGISTRY), ledger_id=ledger_id)[1]]
    current = [_row(c.violation, c) for c in api.current.findings() if c.violation.ledger_id == ledger_id]
    md = read.metadata
    if md is None and read.error is None and not findings and not current:
        raise HttpError(404, f"no such ledger: {ledger_id} is not in the metadata, and no finding names it")
    full = api.last_run("full")
    state, why = _checked(md, read, full, findings or current)
    segments: list[console.SegmentView] = []
    asked = ""
    if md is not None and md.state is LedgerState.CLOSED and ask:
        try:
            registered, _ = api.cluster.bookies_now()
            segments = console.copies(md, api.cluster.ask_bookies(md), registered.keys())
        except ScrutinyError as exc:
            asked = f"could not ask the bookies now: {one_line(exc)}"
    # the owner its own metadata names (Pulsar's keys), whether or not some finding names it
    own = owner_from_custom_metadata(md.custom_metadata) if md is not None else None
    owner = (own.name or own.kind) if own is not None else next((f["owner"] for f in findings + current
                                                                 if f["owner"]), "")
    return {"ledger_id": ledger_id, "checked": state, "why": why, "metadata": md, "error": read.error,
            "segments": segments, "asked": asked, "findings": findings, "current": current, "owner": owner}


def _html(code: int, template: str, title: str, **context: Any) -> Response:
    page = TEMPLATES.get_template(f"{template}.html").render(title=title, **context)
    return Response(code, "text/html; charset=utf-8", page.encode())


def _json(status: int, doc: Any) -> Response:
    return Response(status, "application/json", json.dumps(doc).encode())


def _link(path: str, query: dict[str, str]) -> str:
    return f"{path}?{urlencode({k: v for k, v in query.items() if v})}"


def _page(req: Request) -> tuple[int, int]:
    try:
        page, size = int(req.query.get("page", "1")), int(req.query.get("page_size", "100"))
    except ValueError:
        raise HttpError(400, "page and page_size are whole numbers") from None
    if not 1 <= page <= MAX_PAGE or not 1 <= size <= MAX_PAGE_SIZE:
        raise HttpError(400, f"page is 1 or more (at most {MAX_PAGE}), page_size 1..{MAX_PAGE_SIZE}")
    return page, size


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
    if len(text) > 19 or int(text) > MAX_LEDGER_ID:
        raise HttpError(400, f"{text} is not a ledger id: ledger ids are 0 .. 2^63-1")
    return int(text)


def _row(v: Violation, current: Any = None) -> dict[str, Any]:
    """One finding as the templates draw it."""
    owner = v.owner.name if v.owner and v.owner.name else (v.owner.kind if v.owner else "")
    return {"ledger_id": v.ledger_id, "category": str(v.category), "severity": severity_of(v.category, v.details),
            "owner": owner, "topic": v.owner.name if v.owner and v.owner.kind == "topic" else "",
            "bookies": v.bookies, "lines": spec(v.category).describe(v.details),
            "detected_at": iso(current.detected_ms) if current is not None else "",
            "found_by": current.found_by if current is not None else ""}


def _checked(md: LedgerMetadata | None, read: LedgerRead, full: Report | RunSummary | None,
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


def _metadata_json(md: LedgerMetadata) -> dict[str, Any]:
    return {"state": md.state.name, "ensemble_size": md.ensemble_size, "write_quorum": md.write_quorum,
            "ack_quorum": md.ack_quorum, "last_entry_id": md.last_entry_id, "length": md.length,
            "ctime": iso(md.ctime) if md.ctime > 0 else None, "format_version": md.format_version,
            "segments": [{"first_entry_id": s.first_entry_id, "ensemble": list(s.ensemble)} for s in md.segments]}


def _bookie_json(r: console.BookieRow) -> dict[str, Any]:
    return {**{k: v for k, v in vars(r).items() if k != "findings"}, "findings": dict(r.findings)}


def _worst_counts(counts: dict[str, int]) -> list[tuple[str, int]]:
    return sorted(((c, n) for c, n in counts.items() if n),
                  key=lambda cn: REGISTRY[Category(cn[0])].rank if cn[0] in CATEGORY_NAMES else 99)


def _leader_link(s: Status, req: Request) -> str:
    if s.leading or not s.leader_address:
        return ""
    return f"http://{s.leader_address.rsplit(':', 1)[0]}:{req.headers.get('Host', ':').rsplit(':', 1)[-1]}/"


def _deep(run: Report | RunSummary | None) -> dict[str, Any] | None:
    if run is None or "deep_pass_slices" not in run.stats:
        return None
    st = run.stats
    return {"permille": st["deep_pass_progress_permille"] / 10, "next": st["deep_pass_next_slice"],
            "slices": st["deep_pass_slices"], "completed": st.get("deep_passes_completed", 0),
            "oldest": in_words(time.time() - st["deep_oldest_verified_ms"] / 1000)}


def _age(run: Report | RunSummary) -> str:
    finished = ms_of(run.finished_at)
    return in_words(time.time() - finished / 1000) if finished else "?"


def _run_duration(run: Report | RunSummary) -> str:
    took = ms_of(run.finished_at) - ms_of(run.started_at)
    return in_words(took / 1000) if took >= 0 else "?"


TEMPLATES.filters["plural"] = console.plural
TEMPLATES.filters["duration_ms"] = lambda ms: in_words(ms / 1000)
TEMPLATES.filters["iso"] = iso
TEMPLATES.globals.update(severities=SEVERITIES, link=_link, spec=spec)


def _status_json(s: Status) -> dict[str, Any]:
    def ticket(t: Ticket) -> dict[str, Any]:
        return {"run_id": t.run_id, "kind": t.kind, "ranges_done": t.ranges_done, "ranges_total": t.ranges_total,
                "complete": bool(t.report and t.report.complete),
                **({"started_at": t.report.started_at, "finished_at": t.report.finished_at,
                    "counts": t.report.counts} if t.report else {})}

    inherited: Iterable[dict[str, Any]] = ({k: v for k, v in i.report_json().items()
                                            if k in ("run_id", "started_at", "finished_at", "counts", "ran_by")}
                                           | {"kind": i.kind, "complete": True} for i in s.inherited)
    # a standby that has not learned who leads yet (just started: the store not reached, the election under way)
    role = "leader" if s.leading else "standby" if s.leader_address else "electing"
    return {"role": role, "leader_address": s.leader_address,
            "current_run": ticket(s.current) if s.current else None,
            "last_runs": [ticket(t) for t in s.own_last()] + list(inherited),
            "next_runs": dict(s.next_runs), "skipped_runs": dict(s.skipped), "queued_runs": s.queued_runs,
            "runs_awaiting_recheck": s.runs_awaiting_recheck}

