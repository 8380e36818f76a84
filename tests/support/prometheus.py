"""A real Prometheus (Debian's) for tests: the shipped alert rules as they are, scraping what the test serves
every second, evaluating every second; queried through its HTTP API."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from scrutiny.testing import processes
from scrutiny.testing.localzk import free_port
from scrutiny.testing.processes import stop
from tests.support.helpers import wait_for

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


class Prometheus:
    def __init__(self, workdir: Path, targets: dict[str, int]) -> None:
        self.port = free_port()
        cfg = workdir / "prometheus.yml"
        shutil.copy(RULES / "scrutiny-rules.yml", workdir / "rules.yml")
        cfg.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [rules.yml]\n"
                       "scrape_configs:\n" + "".join(
                           f"  - job_name: {job}\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
                           for job, port in targets.items()))
        self.proc = processes.spawn(["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={workdir / 'tsdb'}",
                                      f"--web.listen-address=127.0.0.1:{self.port}"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=workdir)
        wait_for(lambda: self._get("/-/ready") is not None, 30)

    def _get(self, path: str) -> Any:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=3) as resp:
                body = resp.read().decode()
                return json.loads(body) if path.startswith("/api") else body
        except OSError:
            return None

    def query(self, expr: str) -> list[dict[str, Any]]:
        got = self._get("/api/v1/query?query=" + urllib.parse.quote(expr))
        return [] if got is None else list(got["data"]["result"])

    def value(self, expr: str) -> float | None:
        got = self.query(expr)
        return float(got[0]["value"][1]) if got else None

    def alerts(self) -> list[dict[str, Any]]:
        got = self._get("/api/v1/alerts") or {"data": {"alerts": []}}
        return list(got["data"]["alerts"])

    def firing(self) -> set[str]:
        return {a["labels"]["alertname"] for a in self.alerts() if a["state"] == "firing"}

    def active(self) -> set[str]:
        """The alerts whose expression holds: firing, or pending for their `for`."""
        return {a["labels"]["alertname"] for a in self.alerts() if a["state"] in ("pending", "firing")}

    def active_since(self, alertname: str) -> set[str]:
        return {a["activeAt"] for a in self.alerts() if a["labels"]["alertname"] == alertname}

    def close(self) -> None:
        stop(self.proc)
