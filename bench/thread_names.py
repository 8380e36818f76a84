"""`python -m bench.thread_names <file> <scrutiny's arguments>`: scrutiny's command line, with its threads'
names written to <file> (JSON, native thread id -> name) at every SIGUSR2. In /proc a process's Python threads
are all called `python`; only gRPC's own threads name themselves."""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from scrutiny.cli import main


def run() -> int:
    out = Path(sys.argv[1])

    def write(signum: int, frame: FrameType | None) -> None:
        part = out.with_suffix(".part")
        part.write_text(json.dumps({t.native_id: t.name for t in threading.enumerate() if t.native_id}))
        part.replace(out)  # whole when it appears

    signal.signal(signal.SIGUSR2, write)
    return main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(run())
