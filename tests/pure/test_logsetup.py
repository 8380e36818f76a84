"""Logging as the CLI configures it."""

from __future__ import annotations

import io
import json
import logging
import sys

import pytest

from scrutiny.logsetup import RUN_ID, configure


@pytest.fixture(autouse=True)
def _root_logger_restored() -> object:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level


def test_lines_follow_stderr_when_it_is_swapped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A handler bound to the stderr of the moment wrote to a closed file once a test's capture ended."""
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    configure()
    logging.getLogger("scrutiny.x").info("one")
    first.close()
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    logging.getLogger("scrutiny.x").warning("two")
    lines = second.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].endswith("WARNING scrutiny.x []: two"), lines  # not a logging error


def test_json_lines_carry_the_run_id(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    configure(json_lines=True)
    token = RUN_ID.set("r-1")
    try:
        logging.getLogger("scrutiny.x").warning("seen")
    finally:
        RUN_ID.reset(token)
    doc = json.loads(out.getvalue().splitlines()[-1])
    assert doc["run_id"] == "r-1" and doc["message"] == "seen" and doc["level"] == "WARNING"
