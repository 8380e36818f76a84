"""Every process a user runs stops cleanly, and says only what it means to: a scan prints each finding once, in
the report; the demo's console address stands last; a stop by a signal (Ctrl-C on the demo, SIGTERM on an
auditor or an agent, with continuous scrutiny's streams open between them) leaves nothing on stderr but the
process' own words: no pending asyncio task destroyed, no lost session that was our own stop, no gRPC core
line about a peer's GOAWAY."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from scrutiny.testing import processes
from scrutiny.testing.demo import DB_BOOKIES, bookie, build_demo_cluster
from scrutiny.testing.localzk import LocalZooKeeper, free_port
from scrutiny.testing.processes import reap, stop
from tests.support.helpers import wait_for
from tests.support.metrics import sample

pytestmark = pytest.mark.slow
SCRUTINY = [sys.executable, "-m", "scrutiny.cli"]
NOISE = re.compile(r"Task was destroyed but it is pending|was never awaited|session lost|chttp2_transport|[Gg]ot goaway"
                   r"|Traceback|^\S+ \S+ ERROR |violation \{", re.MULTILINE)


def noise(stderr: Path) -> list[str]:
    text = stderr.read_text()
    return [text[max(0, m.start() - 200):m.end() + 200] for m in NOISE.finditer(text)]


def spawn(args: list[str], stderr: Path, **kw: object) -> subprocess.Popen[str]:
    with stderr.open("w") as err:
        return processes.spawn([*SCRUTINY, *args], stdout=subprocess.PIPE, stderr=err, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"}, **kw)  # type: ignore[arg-type]


def test_the_demo_prints_each_finding_once_and_stops_clean_on_ctrl_c(tmp_path: Path) -> None:
    err = tmp_path / "demo.err"
    proc = spawn(["demo", "--engine", "local", "--ledgers", "60"], err, cwd=tmp_path)
    try:
        assert proc.stdout is not None
        out: list[str] = []
        deadline = time.monotonic() + 180
        while not any("the console: " in line for line in out) and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            out.append(line)
        assert any("the console: " in line for line in out), "".join(out)[-3000:]
        url = next(line for line in out if "the console: " in line).split("the console: ")[1].split(" ")[0]
        # the console's auditor follows every agent's feed: the streams are open when Ctrl-C comes
        wait_for(lambda: (sample(urllib.request.urlopen(f"{url}metrics", timeout=10).read().decode(),
                                 "scrutiny_continuous_feeds", '{kind="agent",state="up"}') or 0) >= 3, 60)
        assert stop(proc, grace=60, sig=signal.SIGINT) is not None and proc.returncode == 0
        rest = proc.stdout.read()
    finally:
        reap(proc)
    text = "".join(out)
    assert text.count("ledger 9001 ") == 2  # once in the report, once in the faults' table: no log line of it
    assert text.rstrip().splitlines()[-1].startswith("the console: ")  # where a person sees it: last
    assert not rest.strip() and not noise(err), (rest, noise(err))


@pytest.fixture
def agents(zk_server: LocalZooKeeper, zk_client: KazooClient, zk_namespace: str,
           tmp_path: Path) -> tuple[str, dict[str, subprocess.Popen[str]], dict[str, Path]]:
    """The demo's cluster; an agent process for each of its DbLedgerStorage bookies (they watch)."""
    root = f"{zk_namespace}/ledgers"
    demo = build_demo_cluster(zk_client, root, tmp_path / "stores", healthy=30)
    uri = f"zk+hierarchical://{zk_server.hosts}{root}"
    procs, errs = {}, {}
    for n in DB_BOOKIES:
        b = bookie(n)
        errs[b] = tmp_path / f"agent-{n}.err"
        procs[b] = spawn(["bookie-agent", "--bookie-id", b, "--source", "dbledgerstorage", "--ledger-dir",
                          str(demo.ledger_dirs[b]), "--scratch-dir", str(tmp_path / f"scratch-{n}"),
                          "--bind", "127.0.0.1:0", "--metadata-service-uri", uri], errs[b])
    for p in procs.values():
        assert "listening on port" in p.stdout.readline()  # type: ignore[union-attr]
    return uri, procs, errs


def test_an_auditor_and_its_agents_stop_clean_with_the_feeds_open(
        agents: tuple[str, dict[str, subprocess.Popen[str]], dict[str, Path]], tmp_path: Path) -> None:
    uri, procs, errs = agents
    metrics = free_port()
    config = tmp_path / "scrutiny.yaml"
    config.write_text(f"metadata_service_uri: {uri}\nrecheck_delay: 0.3\nengine: local\nplacement_policy: none\n"
                      f"auditor:\n  listen: 127.0.0.1:0\n  reports_dir: {tmp_path / 'reports'}\n"
                      "  underreplication_interval_seconds: 0\n  insecure_open_rescan: true\n"
                      f"metrics:\n  listen: 127.0.0.1:{metrics}\n")
    err = tmp_path / "auditor.err"
    auditor = spawn(["auditor", "--config", str(config)], err)
    try:
        def feeds_up() -> float:
            assert auditor.poll() is None, err.read_text()[-2000:]
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5).read().decode()
            except OSError:
                return 0
            return sample(text, "scrutiny_continuous_feeds", '{kind="agent",state="up"}') or 0

        wait_for(lambda: feeds_up() >= len(procs), 120)
        first = next(iter(procs))
        assert stop(procs[first], grace=30) is not None and procs[first].returncode == 0  # a feed's agent goes
        time.sleep(1)
        assert stop(auditor, grace=60) is not None and auditor.returncode == 0
        for p in procs.values():
            assert stop(p, grace=30) is not None and p.returncode == 0
    finally:
        for p in [auditor, *procs.values()]:
            reap(p)
    found = {name: noise(path) for name, path in [("auditor", err), *errs.items()]}
    assert not any(found.values()), found


def test_a_scan_prints_each_finding_once(agents: tuple[str, dict[str, subprocess.Popen[str]], dict[str, Path]],
                                         tmp_path: Path) -> None:
    uri, procs, _ = agents
    try:
        res = processes.run([*SCRUTINY, "scan", "--metadata-service-uri", uri, "--engine", "local", "--format",
                             "json", "--recheck-delay", "0.3", "--log-level", "INFO"], capture_output=True,
                            text=True, timeout=180)
    finally:
        for p in procs.values():
            stop(p, grace=30)
            reap(p)
    assert res.returncode == 1
    assert 9010 in {v["ledger_id"] for v in json.loads(res.stdout)["violations"]}
    # in the report, and only there: as a number (a run id such as 99010b929493 may hold its digits)
    assert re.search(r"\b9010\b", res.stderr) is None
    err = tmp_path / "scan.err"
    err.write_text(res.stderr)
    assert not noise(err), noise(err)
