"""scrutiny as an operator installs it, run for real (`make image-test`, not `make test`): the wheel in a
clean venv with no dev extras, and the image, each against a real ZooKeeper and real agents."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from scrutiny.agent import BookieAgent
from scrutiny.bookieclient import BookieClient, EndpointResolver
from scrutiny.entrysources import DbLedgerStorageSource
from scrutiny.testing.dbledgerstorage import write_index
from scrutiny.testing.demo import DemoCluster
from scrutiny.testing.localzk import free_port

pytestmark = pytest.mark.install
ROOT = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("SCRUTINY_IMAGE", "scrutiny:0.1.0")
WHEELHOUSE = ROOT / "dist" / "wheelhouse"
COMMANDS = ("scan", "whatif", "bookie-agent", "auditor", "rescan", "demo")


def findings(report_json: str) -> set[tuple[str, int]]:
    return {(v["category"], v["ledger_id"]) for v in json.loads(report_json)["violations"]}


# -- the wheel in a clean venv -------------------------------------------------------------------

@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`python -m venv` and the wheel from the wheelhouse, offline: no dev extras, no source tree."""
    wheels = sorted(WHEELHOUSE.glob("scrutiny-*.whl"))
    assert wheels, "no wheel in dist/wheelhouse: run `make wheelhouse`"
    root = tmp_path_factory.mktemp("venv") / "scrutiny"
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    subprocess.run([str(root / "bin" / "pip"), "install", "-q", "--no-index", "--find-links", str(WHEELHOUSE),
                    "scrutiny"], check=True, env={k: v for k, v in os.environ.items() if not k.startswith("PIP_")})
    return root


def run_venv(venv: Path, *args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    # cwd outside the checkout: nothing can be imported from the source tree by accident.
    return subprocess.run([str(venv / "bin" / "scrutiny"), *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": ""})


def test_wheel_has_no_dev_extras_and_every_command_starts(venv: Path, tmp_path: Path) -> None:
    freeze = subprocess.run([str(venv / "bin" / "pip"), "freeze"], capture_output=True, text=True).stdout
    assert "grpcio-tools" not in freeze and "pytest" not in freeze
    res = run_venv(venv, "--version", cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.startswith("scrutiny 0."), res.stderr
    for command in COMMANDS:
        res = run_venv(venv, command, "--help", cwd=tmp_path)
        assert res.returncode == 0 and "usage: scrutiny" in res.stdout, (command, res.stderr[-2000:])


def test_wheel_scan_finds_the_injected_faults_on_spark(venv: Path, demo: tuple[DemoCluster, str],
                                                      tmp_path: Path) -> None:
    cluster, uri = demo
    out = tmp_path / "report.json"
    res = run_venv(venv, "scan", "--metadata-service-uri", uri, "--format", "json", "--output", str(out),
                   "--recheck-delay", "0.5", "--underreplicated-grace-period", "3600", "--spark-master", "local[2]",
                   cwd=tmp_path)
    assert res.returncode == 1, res.stderr[-3000:]
    assert findings(out.read_text()) == cluster.expected


def test_wheel_systemd_units_verify_against_the_installed_program(venv: Path, tmp_path: Path) -> None:
    for unit in (ROOT / "deploy" / "systemd").glob("*.service"):
        (tmp_path / unit.name).write_text(unit.read_text().replace("/opt/scrutiny", str(venv)))
    res = subprocess.run(["systemd-analyze", "verify", "--man=no", *sorted(map(str, tmp_path.glob("*.service")))],
                         capture_output=True, text=True)
    assert res.returncode == 0 and not (res.stdout + res.stderr).strip(), res.stdout + res.stderr


# -- the image ------------------------------------------------------------------------------------

def docker(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def image() -> str:
    if shutil.which("docker") is None or docker("image", "inspect", IMAGE).returncode != 0:
        pytest.fail(f"image {IMAGE} is not built: run `make image-test`")
    return IMAGE


# As the Kubernetes manifests run it: not root, read-only root filesystem, writable /tmp only.
HARDENED = ("--network", "host", "--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges")


def test_image_version_user_and_generated_code(image: str) -> None:
    res = docker("run", "--rm", image, "--version")
    assert res.returncode == 0 and res.stdout.startswith("scrutiny 0."), res.stderr
    res = docker("run", "--rm", "--entrypoint", "id", image)
    assert res.stdout.startswith("uid=10001(scrutiny) gid=10001(scrutiny)"), res.stdout


def test_image_scan_as_on_the_host(image: str, demo: tuple[DemoCluster, str]) -> None:
    cluster, uri = demo
    res = docker("run", "--rm", *HARDENED, image, "scan", "--metadata-service-uri", uri, "--format", "json",
                 "--recheck-delay", "0.5", "--underreplicated-grace-period", "3600", "--spark-master", "local[2]")
    assert res.returncode == 1, res.stderr[-3000:]
    assert findings(res.stdout) == cluster.expected
    bad = docker("run", "--rm", *HARDENED, image, "scan", "--metadata-service-uri", "zk+nonsense://x/ledgers")
    assert bad.returncode == 2 and bad.stderr.startswith("scrutiny scan:"), bad.stderr


def _tree(path: Path) -> dict[str, tuple[int, int, str]]:
    return {str(p.relative_to(path)): (p.stat().st_mtime_ns, p.stat().st_mode,
                                       hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "")
            for p in sorted(path.rglob("*"))}


def test_image_agent_over_a_read_only_dbledgerstorage_index(image: str, tmp_path: Path) -> None:
    """The sidecar's story: the bookie's files are Pulsar's (uid 10000, group 0, group-readable, nothing for
    others); the agent runs as 10001 with group 0 added (the chart's fsGroup: 0) and a read-only mount."""
    ledgers = tmp_path / "ledgers"
    write_index(ledgers, {2: range(0, 50), 4: [0, 2, 4], 7: range(10, 20), 9: [0, 1, 5]}, limbo=[9])
    subprocess.run(["chown", "-R", "10000:0", str(ledgers)], check=True)
    subprocess.run(["chmod", "-R", "u=rwX,g=rX,o=", str(ledgers)], check=True)
    before = _tree(ledgers)
    asked = [2, 4, 7, 9, 99]
    host_agent = BookieAgent(DbLedgerStorageSource([ledgers], scratch_dir=tmp_path / "scratch"),
                             bind="127.0.0.1:0").start()
    try:
        with BookieClient(EndpointResolver({"b1:3181": f"127.0.0.1:{host_agent.port}"})) as c:
            on_host = {lid: (a.outcome, a.availability and a.availability.entry_ids().tolist())
                       for lid, a in c.fetch("b1:3181", asked).items()}
    finally:
        host_agent.stop(grace=0)
    port = free_port()
    started = docker("run", "-d", "--rm", *HARDENED, "--user", "10001:10001", "--group-add", "0",
                     "-v", f"{ledgers}:/pulsar/data/bookkeeper/ledgers:ro", image, "bookie-agent",
                     "--bookie-id", "b1:3181", "--source", "dbledgerstorage",
                     "--ledger-dir", "/pulsar/data/bookkeeper/ledgers", "--scratch-dir", "/tmp/scratch",
                     "--bind", f"127.0.0.1:{port}")
    assert started.returncode == 0, started.stderr
    container = started.stdout.strip()
    try:
        wait_serving(f"127.0.0.1:{port}", container)
        with BookieClient(EndpointResolver({"b1:3181": f"127.0.0.1:{port}"})) as c:
            in_image = {lid: (a.outcome, a.availability and a.availability.entry_ids().tolist())
                        for lid, a in c.fetch("b1:3181", asked).items()}
    finally:
        docker("stop", "-t", "10", container)
    assert in_image == on_host
    assert _tree(ledgers) == before  # not one byte, mode or mtime of the bookie's files changed


def wait_serving(address: str, container: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with grpc.insecure_channel(address) as channel:
            try:
                status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
        time.sleep(0.5)
    logs = docker("logs", container)
    raise AssertionError(f"{address} never served; container log: {(logs.stdout + logs.stderr)[-3000:]}")


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def full_runs(samples: Samples) -> float:
    return sum(v for (name, labels), v in samples.items()
               if name == "scrutiny_runs_total" and ("kind", "full") in labels)


def test_image_auditor_health_and_metrics(image: str, demo: tuple[DemoCluster, str], tmp_path: Path) -> None:
    _, uri = demo
    rpc, metrics = free_port(), free_port()
    config = tmp_path / "scrutiny.yaml"
    config.write_text(f"""metadata_service_uri: {uri}
recheck_delay: 0.5
underreplicated_grace_period: 3600
engine: local
auditor:
  listen: 127.0.0.1:{rpc}
  reports_dir: /tmp/reports
  full_interval_seconds: 3600
  underreplication_interval_seconds: 0
  insecure_open_rescan: true
metrics:
  listen: 127.0.0.1:{metrics}
""")
    config.chmod(0o644)
    started = docker("run", "-d", "--rm", *HARDENED, "-v", f"{config}:/etc/scrutiny/scrutiny.yaml:ro", image,
                     "auditor", "--config", "/etc/scrutiny/scrutiny.yaml")
    assert started.returncode == 0, started.stderr
    container = started.stdout.strip()
    try:
        wait_serving(f"127.0.0.1:{rpc}", container)
        deadline, samples = time.monotonic() + 120, Samples()
        while time.monotonic() < deadline and not full_runs(samples):
            time.sleep(1)
            with contextlib.suppress(OSError):
                samples = scrape(f"http://127.0.0.1:{metrics}/metrics")
        assert full_runs(samples) == 1, samples
        assert samples[("scrutiny_violations", (("category", "NO_REPLICA_OF_AN_ENTRY"),))] == 1, samples
    finally:
        stopped = docker("stop", "-t", "30", container)
    assert stopped.returncode == 0
