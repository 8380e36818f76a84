"""The operator's console and HTTP API, on the port that serves /metrics: where an operator goes when an
alert fires ("is data at risk, which topics, which ledgers, which bookies, since when"), in a browser
(`pages`) or with curl (`api`, which asks the auditor exactly what the Auditor RPC asks it).

Here: the routes, and who may call what, with the RPC's rules: the state-changing and costly calls (rescan,
what-if) need the bearer token or a verified client certificate; reading is open unless
`status_requires_auth`. Every refusal is a 4xx with a JSON body saying what was wrong (HTML to a browser on
the pages); what a request asks for is checked in `asking`.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc

from scrutiny.auditor.face import AuditorFace
from scrutiny.console.api import ConsoleApi, json_response
from scrutiny.console.asking import HttpError, WebApi
from scrutiny.console.pages import ConsolePages, html
from scrutiny.errors import NotLeader, ScrutinyError, one_line
from scrutiny.httpserver import Request, Response, json_error

HTTP_STATUS = {grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.UNAUTHENTICATED: 401,
               grpc.StatusCode.NOT_FOUND: 404, grpc.StatusCode.FAILED_PRECONDITION: 409,
               grpc.StatusCode.RESOURCE_EXHAUSTED: 429, grpc.StatusCode.UNAVAILABLE: 503}


class AuditorWeb:
    """The application `HttpServer` serves beside /metrics: the routes of the pages (`pages`) and the API
    (`api`), who may call what, and every refusal."""

    def __init__(self, auditor: AuditorFace) -> None:
        s = auditor.auditor_settings()
        self.auth, self.reads_need_token = auditor.authenticator(), s.status_requires_auth
        api = WebApi(auditor)
        pages, json_api = ConsolePages(api), ConsoleApi(api, s.rescan_wait_seconds)
        self.routes: dict[tuple[str, str], Callable[[Request], Response]] = {
            ("GET", "/"): pages.page_home, ("GET", "/findings"): pages.page_findings,
            ("GET", "/findings.csv"): pages.export_csv, ("GET", "/bookies"): pages.page_bookies,
            ("GET", "/blast-radius"): pages.page_blast, ("GET", "/api/v1/status"): json_api.api_status,
            ("GET", "/api/v1/report"): json_api.api_report, ("GET", "/api/v1/current"): json_api.api_current,
            ("GET", "/api/v1/blast-radius"): json_api.api_blast, ("GET", "/api/v1/bookies"): json_api.api_bookies,
            ("GET", "/api/v1/history"): json_api.api_history, ("GET", "/topics"): pages.page_topic,
            ("GET", "/api/v1/topics"): json_api.api_topic, ("GET", "/api/v1/handoffs"): json_api.api_handoffs,
            ("GET", "/handoffs"): pages.page_handoffs,
            ("GET", "/tenants"): pages.page_scope("tenant"), ("GET", "/namespaces"): pages.page_scope("namespace"),
            ("GET", "/api/v1/tenants"): json_api.api_scope("tenant"),
            ("GET", "/api/v1/namespaces"): json_api.api_scope("namespace"),
            ("POST", "/api/v1/rescan"): json_api.api_rescan, ("POST", "/api/v1/whatif"): json_api.api_whatif}
        self.ledger_page, self.ledger_api = pages.page_ledger, json_api.api_ledger

    def __call__(self, req: Request) -> Response | None:
        path = req.path.rstrip("/") or "/"
        handler = self.routes.get((req.method, path))
        if handler is None and req.method == "GET" and path.startswith(("/ledgers/", "/api/v1/ledgers/")):
            handler = self.ledger_api if path.startswith("/api/") else self.ledger_page
        page = not path.startswith("/api/")
        try:
            if handler is None:
                allow = self.methods(path)
                if allow:
                    raise HttpError(405, f"{req.method} is not served at {path} (only {', '.join(allow)})", allow)
                if path.startswith("/api/") or path == "/ledgers":
                    raise HttpError(404, f"no such call: {path} (the API: /api/v1/status, report, current, "
                                         "ledgers/<id>, topics?name=, tenants?name=, namespaces?name=, bookies, "
                                         "history, blast-radius, handoffs; POST rescan, whatif)")
                return None
            if req.method == "POST" or self.reads_need_token:  # the pages too: they show what the API does
                self._authenticate(req)
            return handler(req)
        except HttpError as exc:
            return self._refusal(req, page, exc.status, str(exc), exc.allow)
        except NotLeader as exc:
            return json_response(409, {"error": one_line(exc), "leader_address": exc.leader})
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
            got = html(status, "error", "error", message=message, http_status=status)
            return Response(got.status, got.content_type, got.body, (("Allow", ", ".join(allow)),) if allow else ())
        return json_error(status, message, allow)

    def _authenticate(self, req: Request) -> None:
        given = req.headers.get("Authorization") or req.headers.get("authorization") or ""
        if not self.auth.allows(given, req.client_verified):
            raise HttpError(401, "a valid bearer token is required (Authorization: Bearer <token>)"
                            if self.auth.token or self.auth.client_ca
                            else "this auditor has no token_file: its HTTP API refuses this call")
