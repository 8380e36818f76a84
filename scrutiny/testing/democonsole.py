"""The demo's console: an auditor on the demo cluster (synthetic or real bookies), served on a local port."""

from __future__ import annotations

import dataclasses
import secrets
import signal
import threading
import time
from pathlib import Path

from scrutiny.auditor import DEEP, Auditor
from scrutiny.auditor.runqueue import Ticket
from scrutiny.config import AuditorSettings, MetricsSettings, ScanSettings
from scrutiny.console.web import AuditorWeb
from scrutiny.scan.engines import LocalEngine


def serve_console(settings: ScanSettings, workdir: Path, port: int, candidate: str) -> None:
    """An auditor on the demo cluster, its console on a local port, until Ctrl-C (or SIGTERM); after its
    first full run, a deep run and the same what-if the demo printed."""
    token = workdir / "token"
    token.write_text(secrets.token_urlsafe(16))
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    auditor = Auditor(dataclasses.replace(settings, engine="local", recheck_delay=1.0),
                      AuditorSettings(listen="127.0.0.1:0", reports_dir=str(workdir / "reports"), token_file=str(token),
                                      underreplication_interval_seconds=0),
                      metrics=MetricsSettings(listen=f"127.0.0.1:{port}"), web=AuditorWeb, engine=LocalEngine()).start()
    try:
        assert auditor.http is not None
        deadline = time.monotonic() + 120
        while "full" not in auditor.last and time.monotonic() < deadline and not stop.is_set():
            time.sleep(0.2)  # its first full run: the console's findings
        deep, _ = auditor.queue.submit(Ticket(DEEP))  # the deep scrub's findings (one slice: the whole cluster)
        whatif, _ = auditor.whatif([candidate], [])  # the what-if the demo printed, under kind=whatif
        for ticket in (deep, whatif):
            while not ticket.done.wait(0.2) and time.monotonic() < deadline + 120 and not stop.is_set():
                pass
        print(f"\nthe console: http://127.0.0.1:{auditor.http.port}/ (the API's token for rescans: "
              f"{token.read_text()}); Ctrl-C to stop", flush=True)
        stop.wait()
    finally:
        auditor.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
