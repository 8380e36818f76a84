"""The console's pages: server-rendered HTML from Jinja2 templates (autoescaped: a topic or bookie name is
never markup), without scripts or external assets (it works in a cluster without internet); the pictures
are inline SVG. Sorting, filtering and paging are links and a form."""

from __future__ import annotations

import csv
import io
import json
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import jinja2

from scrutiny.auditor.face import KINDS, RunSummary, Status
from scrutiny.categories import REGISTRY, SEVERITIES, Category, severity_of, spec, worst_first
from scrutiny.console import display
from scrutiny.console.asking import Asking, HttpError, known_rack, ledger_id_of, link, page_of
from scrutiny.console.ledgerview import finding_row, ledger_view
from scrutiny.console.scopeview import scope_of, scope_view
from scrutiny.console.topicview import topic_name_of, topic_view
from scrutiny.httpserver import Request, Response
from scrutiny.report import Report
from scrutiny.times import in_words, iso, ms_of

BLAST_COLUMNS = ("ledgers_below_aq", "ledgers_without_a_copy", "topics_below_aq", "topics_without_a_copy")
REFRESH_SECONDS = 60
CSV_COLUMNS = ("ledger_id", "category", "severity", "owner_kind", "owner", "bookies", "details")

TEMPLATES = jinja2.Environment(loader=jinja2.PackageLoader("scrutiny.console", "templates"),
                               autoescape=jinja2.select_autoescape(default=True), undefined=jinja2.StrictUndefined,
                               trim_blocks=True, lstrip_blocks=True)


class ConsolePages(Asking):
    def page_home(self, req: Request) -> Response:
        s = self.api.auditor.status()
        state = self.api.auditor.current
        found = state.findings()
        runs = []
        for kind in KINDS:
            run = self.api.auditor.last_run(kind)
            if run is not None:
                runs.append({"kind": kind, "run": run, "age": age(run), "summary": isinstance(run, RunSummary),
                             "duration": run_duration(run), "bad": worst_counts(run.counts)})
        full = self.api.auditor.last_run("full")
        checked = bool(state.baseline_ms) or full is not None
        verdict = display.verdict((c.violation for c in found) if state.baseline_ms else
                                  (full.violations if isinstance(full, Report) else []), checked,
                                  not isinstance(full, Report) or full.complete)
        since = state.previous_full_ms
        history = self.api.cluster.run_history()
        now = self.api.auditor.current_state(most=10, newest_first=True) if s.leading else None
        feeds = sorted(Counter(now["feeds"].values()).items()) if now else []
        return html(200, "home", "scrutiny", status=s, leader_link=leader_link(s, req), verdict=verdict, runs=runs,
                     now=now, feeds=feeds, baseline_kind=state.baseline_kind or "full",
                     new=[finding_row(c.violation, c, state.repair) for c in found
                          if c.detected_ms > since][:50] if since else [],
                     resolved=state.resolved(since)[:50] if since else [], since=iso(since) if since else "",
                     chart=display.chart(history), deep=deep_progress(self.api.auditor.last_run("deep")),
                     recent=[p for p in history if p.kind in display.WHOLE_RUNS][-5:][::-1], refresh=REFRESH_SECONDS)

    def page_findings(self, req: Request) -> Response:
        kind, run = self.run(req)
        q = self.filters(req)
        if isinstance(run, RunSummary):
            return html(200, "findings", f"{kind} findings", summary=run, kind=kind, q=q)
        total, found = self.filtered(req, run)
        page, size = page_of(req)
        pages = -(-total // size)
        nav = [(p, link("/findings", {**req.query, "page": str(p)})) for p in range(1, min(pages, 50) + 1)]
        detected = {(c.violation.category, c.violation.ledger_id): c for c in self.api.auditor.current.findings()}
        query = {k: v for k, v in req.query.items() if k not in ("page", "page_size")}
        return html(200, "findings", f"{kind} findings", kind=kind, run=run, total=total, q=q,
                     rack=req.query.get("rack", ""), categories=worst_first(),
                     rows=[finding_row(v, detected.get((v.category, v.ledger_id)), run.repair) for v in found],
                     topics=run.violations.per_topic(50, q["category"], q["topic"], q["bookie"]), nav=nav, page=page,
                     summary=None, csv=link("/findings.csv", query),
                     json=link("/api/v1/report", {**query, "page_size": "1000"}))

    def export_csv(self, req: Request) -> Response:
        """Every matching finding of the run (not a page of them), one row each."""
        _, run = self.run(req)
        if isinstance(run, RunSummary):
            raise HttpError(404, "that run was made by an earlier leader: its findings are in its reports_dir")
        q = self.filters(req)
        total, _ = run.violations.worst(0, 0, q["category"], q["topic"], q["bookie"])
        _, found = run.violations.worst(total, 0, q["category"], q["topic"], q["bookie"])
        out = io.StringIO()
        w = csv.writer(out)
        w.writerow(CSV_COLUMNS)
        for v in found:
            w.writerow([v.ledger_id, v.category, severity_of(v.category, v.details), v.owner.kind if v.owner else "",
                        v.owner.name if v.owner else "", " ".join(v.bookies), json.dumps(v.details)])
        return Response(200, "text/csv; charset=utf-8", out.getvalue().encode())

    def page_topic(self, req: Request) -> Response:
        view = topic_view(self.api, topic_name_of(req.query.get("name", "")))
        return html(200, "topic", view["topic"], **view)

    def page_scope(self, kind: str) -> Callable[[Request], Response]:
        """/tenants?name=T, /namespaces?name=T/NS."""
        def page(req: Request) -> Response:
            view = scope_view(self.api, scope_of(kind, req.query.get("name", "")))
            return html(200, "scope", f"{kind} {view[kind]}", kind=kind, name=view[kind], **view)
        return page

    def page_handoffs(self, req: Request) -> Response:
        h = self.api.auditor.handoff
        return html(200, "handoffs", "hand-offs to autorecovery", mode=h.mode, handed=[x.to_json() for x in h.handed()])

    def page_ledger(self, req: Request) -> Response:
        view = ledger_view(self.api, ledger_id_of(req.path), ask=True)
        return html(200, "ledger", f"ledger {view['ledger_id']}", **view)

    def page_bookies(self, req: Request) -> Response:
        rows = self.bookie_rows()
        rack = req.query.get("rack", "").strip()
        if rack:
            rows = [r for r in rows if r.rack == known_rack(rack, {r.bookie: r.rack for r in rows})]
        racks: dict[str, list[display.BookieRow]] = {}
        for r in rows:
            racks.setdefault(r.rack or "(no rack)", []).append(r)
        _, finished = self.dependencies()
        return html(200, "bookies", "bookies" + (f" on {rack}" if rack else ""), rows=rows,
                     racks=sorted(racks.items()), tallest=max(map(len, racks.values()), default=0), rack=rack,
                     finished=finished, states=display.STATES, refresh=REFRESH_SECONDS)

    def page_blast(self, req: Request) -> Response:
        _, run = self.run(req)
        if run.blast_radius is None:
            raise HttpError(404, "the last run computed no blast radius")
        scope = req.query.get("scope", "bookies")
        sort = req.query.get("sort", "ledgers_below_aq")
        if scope not in ("bookies", "racks") or sort not in (*BLAST_COLUMNS, "name"):
            raise HttpError(400, f"scope is bookies or racks; sort is name or one of {', '.join(BLAST_COLUMNS)}")
        descending = req.query.get("order", "desc") != "asc"
        entries = list(run.blast_radius.get(scope, {}).items())
        entries.sort(key=lambda e: e[0] if sort == "name" else (e[1].get(sort, 0), e[0]), reverse=descending)
        head = [(c, link("/blast-radius", {**req.query, "sort": c,
                                            "order": "asc" if sort == c and descending else "desc"}))
                for c in ("name", *BLAST_COLUMNS)]
        # its ledgers' copies unknown, the run could not count what its going down would do
        silent = [r for r in self.bookie_rows() if r.state in ("down", "slow", "unregistered")]
        return html(200, "blast", f"blast radius per {scope[:-1]}", scope=scope,
                     other="racks" if scope == "bookies" else "bookies", run=run, age=age(run), head=head,
                     entries=entries, columns=BLAST_COLUMNS, silent=silent)


def html(code: int, template: str, title: str, **context: Any) -> Response:
    page = TEMPLATES.get_template(f"{template}.html").render(title=title, **context)
    return Response(code, "text/html; charset=utf-8", page.encode())


def worst_counts(counts: Mapping[Category, int]) -> list[tuple[Category, int]]:
    return sorted(((c, n) for c, n in counts.items() if n), key=lambda cn: REGISTRY[cn[0]].rank)


def leader_link(s: Status, req: Request) -> str:
    if s.leading or not s.leader_address:
        return ""
    return f"http://{s.leader_address.rsplit(':', 1)[0]}:{req.headers.get('Host', ':').rsplit(':', 1)[-1]}/"


def deep_progress(run: Report | RunSummary | None) -> dict[str, Any] | None:
    if run is None or "deep_pass_slices" not in run.stats:
        return None
    st = run.stats
    return {"permille": st["deep_pass_progress_permille"] / 10, "next": st["deep_pass_next_slice"],
            "slices": st["deep_pass_slices"], "completed": st.get("deep_passes_completed", 0),
            "oldest": in_words(time.time() - st["deep_oldest_verified_ms"] / 1000)}


def age(run: Report | RunSummary) -> str:
    finished = ms_of(run.finished_at)
    return in_words(time.time() - finished / 1000) if finished else "?"


def run_duration(run: Report | RunSummary) -> str:
    took = ms_of(run.finished_at) - ms_of(run.started_at)
    return in_words(took / 1000) if took >= 0 else "?"


TEMPLATES.filters["plural"] = display.plural
TEMPLATES.filters["duration_ms"] = lambda ms: in_words(ms / 1000)
TEMPLATES.filters["iso"] = iso
TEMPLATES.globals.update(severities=SEVERITIES, link=link, spec=spec)

