"""`/metrics` for Prometheus (the prometheus_client library): one private registry per process, served
on the `metrics.listen` address (never port 8000: bookies use it for their own /metrics). Names follow
Prometheus' conventions under one prefix, `scrutiny_`, plus BookKeeper's own auditor gauge names
(`auditor_<NAME>`) so that existing dashboards and alerts keep working."""

from __future__ import annotations

import logging
import threading
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from cheroot import wsgi
from prometheus_client import CollectorRegistry, make_wsgi_app

from scrutiny.errors import ConfigError
from scrutiny.metadata import parse_host_port

PREFIX = "scrutiny_"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, str]  # the last value of each parameter
    headers: Mapping[str, str]
    body: bytes = b""


@dataclass(frozen=True)
class Response:
    status: int
    content_type: str
    body: bytes


App = Callable[[Request], "Response | None"]  # None: not one of its paths (404)
MAX_BODY_BYTES = 1 << 20
WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class MetricsEndpoint:
    """/metrics for one registry (prometheus_client's own WSGI application: it negotiates the format
    with the scraper's Accept, OpenMetrics or text 0.0.4, and gzip), and an application's pages beside it
    (the auditor's), on a threaded production WSGI server (cheroot, CherryPy's). It refuses a malformed
    or oversized Content-Length itself. `port` is the one bound (listen on port 0 in tests)."""

    def __init__(self, listen: str, registry: CollectorRegistry, threads: int = 8) -> None:
        host, port = parse_host_port(listen, "metrics.listen", ConfigError)
        self.registry = registry
        self.app: App | None = None
        self._metrics: WSGIApp = make_wsgi_app(registry)
        self._server = wsgi.Server((host, port), self._dispatch, numthreads=threads, server_name="scrutiny")
        self._server.max_request_body_size = MAX_BODY_BYTES
        try:
            self._server.prepare()
        except OSError as exc:
            raise ConfigError(f"metrics.listen: cannot listen on {listen}: {exc.strerror or exc}") from None
        self._thread = threading.Thread(target=self._server.serve, name="metrics-http", daemon=True)
        self._thread.start()
        self.port = int(self._server.bind_addr[1])

    def _dispatch(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
        if path == "/metrics" and method in ("GET", "HEAD"):
            return self._metrics(environ, start_response)
        response = None
        if self.app is not None:
            try:
                length = int(environ.get("CONTENT_LENGTH") or 0)  # well-formed and bounded: cheroot checked
                body = environ["wsgi.input"].read(length) if length > 0 else b""
                headers = {k[5:].replace("_", "-").title(): v for k, v in environ.items() if k.startswith("HTTP_")}
                query = dict(urllib.parse.parse_qsl(environ.get("QUERY_STRING", "")))
                response = self.app(Request(method, path, query, headers, body))
            except Exception as exc:  # one bad request never stops the server
                log.exception("%s %s", method, path)
                response = Response(500, "text/plain", f"{type(exc).__name__}: {exc}".encode())
        if response is None:
            response = Response(404, "text/plain", f"no page at {path}".encode())
        start_response(f"{response.status} {HTTPStatus(response.status).phrase}",
                       [("Content-Type", response.content_type), ("Content-Length", str(len(response.body)))])
        return [response.body]

    def close(self) -> None:
        self._server.stop()
        self._thread.join(timeout=5)


def family_names(registry: Any) -> set[str]:
    """Every metric name a registry exports now, as Prometheus sees them (counters with `_total`)."""
    names = set()
    for family in registry.collect():
        for sample in family.samples:
            names.add(sample.name)
    return names
