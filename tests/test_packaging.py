"""The generator pinned for building and the runtime the package asks for agree (the generated code
refuses a grpcio or protobuf older than the grpcio-tools that wrote it), and the one generation step
writes a module for every proto."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

from scrutiny.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "build_support"))
from protogen import generated_modules, proto_files  # noqa: E402


def _pins() -> tuple[dict[str, str], str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    lower = {m.group(1): m.group(2) for d in project["project"]["dependencies"]
             if (m := re.match(r"([\w-]+)>=([\d.]+)", d))}
    build_tools = next(r for r in project["build-system"]["requires"] if r.startswith("grpcio-tools"))
    dev_tools = next(r for r in project["project"]["optional-dependencies"]["dev"] if r.startswith("grpcio-tools"))
    return lower, build_tools, dev_tools


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def test_build_and_dev_generate_with_the_same_grpcio_tools() -> None:
    _, build_tools, dev_tools = _pins()
    assert build_tools == dev_tools and "==" in build_tools


def test_runtime_lower_bounds_admit_only_what_the_generated_code_accepts() -> None:
    lower, _, _ = _pins()
    gencode = (ROOT / "scrutiny" / "v1" / "bookie_pb2.py").read_text()
    protobuf = re.search(r"# Protobuf Python Version: ([\d.]+)", gencode)
    stubs = (ROOT / "scrutiny" / "v1" / "bookie_pb2_grpc.py").read_text()
    grpc = re.search(r"GRPC_GENERATED_VERSION = '([\d.]+)'", stubs)
    assert protobuf and grpc
    assert _version(lower["protobuf"]) >= _version(protobuf.group(1))
    assert _version(lower["grpcio"]) >= _version(grpc.group(1))


def test_every_proto_has_its_generated_modules() -> None:
    assert len(proto_files()) == 8
    assert all(p.exists() for p in generated_modules()), [p for p in generated_modules() if not p.exists()]


def test_version_flag(capsys: object) -> None:
    import pytest

    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["--version"])
    assert exc.value.code == 0
    assert re.match(r"scrutiny \d+\.\d+\.\d+", capsys.readouterr().out)  # type: ignore[attr-defined]
