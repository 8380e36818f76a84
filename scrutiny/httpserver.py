"""The HTTP server of an agent's and an auditor's `metrics.listen` address (never port 8000: bookies use it for
their own /metrics): `/metrics` from a prometheus_client registry (its own WSGI application), and an
application's pages beside it (the auditor's console), on cheroot with HTTPS; every refusal in JSON."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from cheroot import server, wsgi
from cheroot.ssl.builtin import BuiltinSSLAdapter
from prometheus_client import CollectorRegistry, make_wsgi_app

from scrutiny.errors import ConfigError
from scrutiny.metadata import parse_host_port
from scrutiny.tls import read_secret

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, str]  # the last value of each parameter
    headers: Mapping[str, str]
    body: bytes = b""
    client_verified: bool = False  # a client certificate the configured client CA verified (HTTPS)

    def wants_html(self) -> bool:
        """A browser (it asks for HTML first); curl and scripts get JSON."""
        return "text/html" in self.headers.get("Accept", "")


@dataclass(frozen=True)
class Response:
    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()  # more, e.g. a 405's Allow


App = Callable[[Request], "Response | None"]  # None: not one of its paths (404); any method: a 405 is the app's
MAX_BODY_BYTES = 1 << 20
WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
METRICS_METHODS = ("GET", "HEAD")


@dataclass(frozen=True)
class HttpsFiles:
    """HTTPS for the endpoint: its certificate and key; with `client_ca`, a client certificate that CA
    signed is verified and counts as authentication (browsers and scrapers without one still connect)."""

    cert: str
    key: str
    client_ca: str = ""

    def context(self) -> BuiltinSSLAdapter:
        for path, what in ((self.cert, "TLS certificate"), (self.key, "TLS key"), (self.client_ca, "TLS client CA")):
            if path:
                read_secret(path, what)  # a clear error naming the file
        try:
            adapter = _TlsOnly(self.cert, self.key)
            if self.client_ca:
                adapter.context.load_verify_locations(self.client_ca)
                adapter.context.verify_mode = ssl.CERT_OPTIONAL
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"HTTPS with {self.cert} and {self.key}: {exc}") from None
        return adapter


def json_error(status: int, message: str, allow: tuple[str, ...] = ()) -> Response:
    """A refusal as every refusal here is made; a 405 says which methods the path serves (`allow`)."""
    return Response(status, "application/json", json.dumps({"error": message}).encode(),
                    (("Allow", ", ".join(allow)),) if allow else ())


def not_served(method: str, path: str, allow: tuple[str, ...]) -> Response:
    return json_error(405, f"{method} is not served at {path} (only {', '.join(allow)})", allow)


PLAIN_HTTP_SECONDS = 1.0  # a plain-HTTP client on the HTTPS port gets this long to send its request
TLS_HANDSHAKE = 0x16  # the first byte of every TLS connection (a handshake record)


class _TlsOnly(BuiltinSSLAdapter):
    """cheroot answers plain HTTP on the HTTPS port itself, in text, then drops the socket with the request
    unread: the kernel resets the connection, and the client reads "connection reset" instead of the answer.
    Here the request is read, the refusal sent in JSON, and the connection closed in order."""

    def wrap(self, sock: socket.socket) -> Any:
        try:
            first = sock.recv(1, socket.MSG_PEEK)
        except OSError:
            first = b""
        if first and first[0] != TLS_HANDSHAKE:
            _refuse_plain_http(sock)
            raise OSError(errno.ECONNABORTED, "plain HTTP on the HTTPS port")  # cheroot drops it quietly
        return super().wrap(sock)


def _refuse_plain_http(sock: socket.socket) -> None:
    body = json.dumps({"error": "this port only speaks HTTPS: use https://"}).encode()
    deadline = time.monotonic() + PLAIN_HTTP_SECONDS
    with contextlib.suppress(OSError):
        _read_until(sock, deadline, lambda got: b"\r\n\r\n" in got)
        sock.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        sock.shutdown(socket.SHUT_WR)
        _read_until(sock, deadline, lambda got: False)  # what else it sent: closed with nothing unread, no reset
    sock.close()


def _read_until(sock: socket.socket, deadline: float, enough: Callable[[bytes], bool]) -> None:
    """What the client sends, until `enough` of it, the deadline, or its end."""
    got = b""
    while len(got) < MAX_BODY_BYTES and not enough(got) and (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return
        if not chunk:
            return
        got += chunk


class _JsonRefusals(server.HTTPRequest):
    """cheroot refuses some requests itself, before any application sees them (a malformed or oversized
    Content-Length, a request line too long): in JSON, as every refusal here. A Content-Length is digits
    (RFC 9110): cheroot takes anything `int` takes, -1 and +5 among them."""

    def read_request_headers(self) -> bool:
        if not super().read_request_headers():
            return False
        length = self.inheaders.get(b"Content-Length")
        if length is not None and not length.isdigit():
            self.close_connection = True
            self.simple_response("400 Bad Request", "Malformed Content-Length Header.")
            return False
        return True

    def simple_response(self, status: Any, msg: Any = "") -> None:
        status = str(status)
        text = msg.decode("latin-1") if isinstance(msg, bytes) else str(msg)
        body = json.dumps({"error": text or status}).encode()
        closing = status[:3] in {"413", "414"}
        if closing:
            self.close_connection = True
        head = [f"{self.server.protocol} {status}", "Content-Type: application/json",
                f"Content-Length: {len(body)}", *(["Connection: close"] if closing else [])]
        with contextlib.suppress(OSError):  # the client went away
            self.conn.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)


class _Connection(server.HTTPConnection):
    RequestHandlerClass = _JsonRefusals


class HttpServer:
    """/metrics for one registry (prometheus_client's own WSGI application: it negotiates the format
    with the scraper's Accept, OpenMetrics or text 0.0.4, and gzip), and an application's pages beside it
    (the auditor's), on a threaded production WSGI server (cheroot, CherryPy's) that speaks HTTPS. It
    refuses a malformed or oversized Content-Length itself, in JSON. `port` is the one bound (listen on
    port 0 in tests)."""

    def __init__(self, listen: str, registry: CollectorRegistry, threads: int = 8,
                 https: HttpsFiles | None = None) -> None:
        host, port = parse_host_port(listen, "metrics.listen", ConfigError)
        self.registry = registry
        self.app: App | None = None
        self.scheme = "https" if https else "http"
        self._metrics: WSGIApp = make_wsgi_app(registry)
        self._server = wsgi.Server((host, port), self._dispatch, numthreads=threads, server_name="scrutiny")
        self._server.ConnectionClass = _Connection
        self._server.max_request_body_size = MAX_BODY_BYTES
        if https is not None:
            self._server.ssl_adapter = https.context()
        try:
            self._server.prepare()
        except OSError as exc:
            raise ConfigError(f"metrics.listen: cannot listen on {listen}: {exc.strerror or exc}") from None
        self._thread = threading.Thread(target=self._server.serve, name="metrics-http", daemon=True)
        self._thread.start()
        self.port = int(self._server.bind_addr[1])

    def _dispatch(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
        if path == "/metrics":
            if method in METRICS_METHODS:
                return self._metrics(environ, start_response)
            response: Response | None = not_served(method, path, METRICS_METHODS)
        else:
            response = self._application(environ, method, path)
        if response is None:
            response = json_error(404, f"no page at {path}")
        start_response(f"{response.status} {HTTPStatus(response.status).phrase}",
                       [("Content-Type", response.content_type), ("Content-Length", str(len(response.body))),
                        *response.headers])
        return [response.body]

    def _application(self, environ: dict[str, Any], method: str, path: str) -> Response | None:
        if self.app is None:
            return None
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)  # well-formed and bounded: cheroot checked
            body = environ["wsgi.input"].read(length) if length > 0 else b""
            headers = {k[5:].replace("_", "-").title(): v for k, v in environ.items() if k.startswith("HTTP_")}
            query = dict(urllib.parse.parse_qsl(environ.get("QUERY_STRING", "")))
            verified = environ.get("SSL_CLIENT_VERIFY") == "SUCCESS"
            return self.app(Request("GET" if method == "HEAD" else method, path, query, headers, body, verified))
        except Exception:  # one bad request never stops the server, nor shows its internals
            log.exception("%s %s", method, path)
            return json_error(500, f"{method} {path} failed inside the auditor; its log says why")

    def close(self) -> None:
        self._server.stop()
        self._thread.join(timeout=5)
