"""The names scrutiny's metrics go by: Prometheus' conventions under one prefix, `scrutiny_`, beside BookKeeper's
own auditor gauge names (`auditor_<NAME>`) so that existing dashboards and alerts keep working."""

from __future__ import annotations

from typing import Any

PREFIX = "scrutiny_"


def family_names(registry: Any) -> set[str]:
    """Every metric name a registry exports now, as Prometheus sees them (counters with `_total`)."""
    names = set()
    for family in registry.collect():
        for sample in family.samples:
            names.add(sample.name)
    return names
