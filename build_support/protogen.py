"""Generate scrutiny's Python code from protos/: the one generation step.

`make proto`, the in-tree build backend (so `pip install .`, `python -m build` and the image) and
nothing else call it, so the code in a checkout, a wheel and an image is made the same way, by the
grpcio-tools pinned in pyproject.toml (build-system.requires and the dev extra).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def proto_files(root: Path = ROOT) -> list[Path]:
    return sorted((root / "protos").rglob("*.proto"))


def generated_modules(root: Path = ROOT) -> list[Path]:
    """The modules generate() writes: `x_pb2.py`, `x_pb2.pyi`, `x_pb2_grpc.py` beside each package."""
    out = []
    for proto in proto_files(root):
        base = root / proto.relative_to(root / "protos").with_suffix("")
        out += [base.with_name(base.name + suffix) for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")]
    return out


def generate(root: Path = ROOT) -> list[Path]:
    """Run protoc (grpc_tools) over every file under protos/, writing into the source tree."""
    protos = proto_files(root)
    if not protos:
        raise SystemExit(f"protogen: no .proto files under {root / 'protos'}")
    cmd = [sys.executable, "-m", "grpc_tools.protoc", "-Iprotos", "--python_out=.", "--pyi_out=.",
           "--grpc_python_out=.", *(str(p.relative_to(root)) for p in protos)]
    res = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"protogen: protoc failed ({res.returncode}): {res.stderr.strip() or res.stdout.strip()}")
    missing = [str(p.relative_to(root)) for p in generated_modules(root) if not p.exists()]
    if missing:
        raise SystemExit(f"protogen: protoc did not write {', '.join(missing)}")
    return generated_modules(root)


if __name__ == "__main__":
    for path in generate():
        print(path.relative_to(ROOT))
