"""Logging: plain or JSON lines, with the run id on every line logged while a run is going."""

from __future__ import annotations

import contextvars
import json
import logging
import sys

from scrutiny.times import iso

RUN_ID: contextvars.ContextVar[str] = contextvars.ContextVar("scrutiny_run_id", default="")


class _RunIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.run_id = RUN_ID.get()
        return True


class JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {"ts": iso(int(record.created * 1000)),
               "level": record.levelname, "logger": record.name, "run_id": getattr(record, "run_id", ""),
               "message": record.getMessage()}
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc)


class _Stderr(logging.StreamHandler):
    """Whatever sys.stderr is when a line is written: a caller that swaps it (a test's capture, a
    daemon redirecting it) never leaves the handler writing to a closed file."""

    @property
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, _: object) -> None:
        pass


# A finding a line, each in full (BP-34), for the daemon's log pipeline; an interactive command prints its
# findings once, in the report the user asked for, and turns this off.
FINDINGS = "scrutiny.findings"


def configure(level: str = "INFO", json_lines: bool = False, findings: bool = True) -> None:
    handler = _Stderr()
    handler.addFilter(_RunIdFilter())
    handler.setFormatter(JsonLines() if json_lines else logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s [%(run_id)s]: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger(FINDINGS).disabled = not findings
    if level != "DEBUG":
        # kazoo narrates every reconnection attempt; our own messages say what matters.
        logging.getLogger("kazoo").setLevel(logging.ERROR)
        logging.getLogger("apscheduler").setLevel(logging.WARNING)
