"""`/metrics` for Prometheus (the prometheus_client library): one private registry per process, served
on the `metrics.listen` address (never port 8000: bookies use it for their own /metrics). Names follow
Prometheus' conventions under one prefix, `scrutiny_`, plus BookKeeper's own auditor gauge names
(`auditor_<NAME>`) so that existing dashboards and alerts keep working."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from scrutiny.errors import ConfigError
from scrutiny.metadata import parse_host_port

PREFIX = "scrutiny_"


class MetricsEndpoint:
    """An HTTP server for one registry; `port` is the one bound (listen on port 0 in tests)."""

    def __init__(self, listen: str, registry: CollectorRegistry) -> None:
        host, port = parse_host_port(listen, "metrics.listen", ConfigError)
        try:
            self._server, self._thread = start_http_server(port, host, registry)
        except OSError as exc:
            raise ConfigError(f"metrics.listen: cannot listen on {listen}: {exc.strerror}") from None
        self.port = int(self._server.server_port)

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
