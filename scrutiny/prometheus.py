"""`/metrics` for Prometheus (the prometheus_client library): one private registry per process, served
on the `metrics.listen` address (never port 8000: bookies use it for their own /metrics). Names follow
Prometheus' conventions under one prefix, `scrutiny_`, plus BookKeeper's own auditor gauge names
(`auditor_<NAME>`) so that existing dashboards and alerts keep working."""

from __future__ import annotations

import threading
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from scrutiny.errors import ConfigError
from scrutiny.metadata import parse_host_port

PREFIX = "scrutiny_"


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


class MetricsEndpoint:
    """An HTTP server for one registry at /metrics, and for an application's pages beside it (the
    auditor's); `port` is the one bound (listen on port 0 in tests)."""

    def __init__(self, listen: str, registry: CollectorRegistry) -> None:
        host, port = parse_host_port(listen, "metrics.listen", ConfigError)
        self.registry = registry
        self.app: App | None = None
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                endpoint._serve(self, "GET")

            def do_POST(self) -> None:
                endpoint._serve(self, "POST")

            def log_message(self, format: str, *args: Any) -> None:
                pass  # an access log per scrape is noise

        try:
            self._server = ThreadingHTTPServer((host, port), Handler)
        except OSError as exc:
            raise ConfigError(f"metrics.listen: cannot listen on {listen}: {exc.strerror}") from None
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics-http", daemon=True)
        self._thread.start()
        self.port = int(self._server.server_port)

    def _serve(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        url = urllib.parse.urlsplit(handler.path)
        response = None
        try:
            if method == "GET" and url.path == "/metrics":
                response = Response(200, CONTENT_TYPE_LATEST, generate_latest(self.registry))
            elif self.app is not None:
                length = int(handler.headers.get("Content-Length") or 0)
                if length > MAX_BODY_BYTES:  # refused unread: this connection ends with the answer
                    handler.close_connection = True
                    response = Response(413, "text/plain", f"a body of at most {MAX_BODY_BYTES} bytes".encode())
                else:
                    body = handler.rfile.read(length) if length > 0 else b""
                    query = dict(urllib.parse.parse_qsl(url.query))
                    response = self.app(Request(method, url.path, query, dict(handler.headers.items()), body))
        except Exception as exc:  # one bad request never stops the server
            response = Response(500, "text/plain", f"{type(exc).__name__}: {exc}".encode())
        if response is None:
            response = Response(404, "text/plain", f"no page at {url.path}".encode())
        handler.send_response(response.status)
        handler.send_header("Content-Type", response.content_type)
        handler.send_header("Content-Length", str(len(response.body)))
        handler.end_headers()
        handler.wfile.write(response.body)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def family_names(registry: Any) -> set[str]:
    """Every metric name a registry exports now, as Prometheus sees them (counters with `_total`)."""
    names = set()
    for family in registry.collect():
        for sample in family.samples:
            names.add(sample.name)
    return names
