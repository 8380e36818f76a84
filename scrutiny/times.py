"""Times as scrutiny writes them: ISO-8601 UTC (the report's to the millisecond, the leaders' records to the
second), read back, and spans in words."""

from __future__ import annotations

import time
from datetime import UTC, datetime


def now_ms() -> int:
    return int(time.time() * 1000)


def iso(ms: int) -> str:
    """A time in ms as the report writes times: `2026-11-26T12:33:22.773Z`."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def iso_seconds(seconds: float) -> str:
    """A time in seconds, to the second: `2026-11-26T12:33:22Z`."""
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def ms_of(iso_time: str) -> int:
    """An ISO-8601 time as ms since the epoch; 0 when it is not one."""
    try:
        return int(datetime.fromisoformat(iso_time.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return 0


def in_words(seconds: float) -> str:
    """A span, to two units: `2d 3h`, `4h 5m`, `6m 7s`."""
    s = int(max(0, seconds))
    if s >= 86400:
        return f"{s // 86400}d {s % 86400 // 3600}h"
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 60}m {s % 60}s"
