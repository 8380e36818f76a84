"""Timing helpers: medians of repeated runs (this machine is small and noisy)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def median_seconds(fn: Callable[[], Any], repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    cols = list(dict.fromkeys(c for r in rows for c in r))
    rows = [{c: r.get(c, "") for c in cols} for r in rows]
    width = {c: max(len(c), *(len(_fmt(r[c])) for r in rows)) for c in cols}
    out = ["| " + " | ".join(c.ljust(width[c]) for c in cols) + " |",
           "|" + "|".join("-" * (width[c] + 2) for c in cols) + "|"]
    out += ["| " + " | ".join(_fmt(r[c]).ljust(width[c]) for c in cols) + " |" for r in rows]
    return "\n".join(out)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)
