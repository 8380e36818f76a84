"""The contract an operator reads (docs/contract.md) names what the code has, and nothing scrutiny ships names
a file outside its repository (our notes from upstream's sources live in docs/formats.md, with their sources)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from scrutiny.categories import REGISTRY
from scrutiny.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = (ROOT / "docs" / "contract.md").read_text()
OUTSIDE = re.compile(r"\.\./shared|shared/spec")
RESULTS = re.compile(r"(bench/results/[\w.-]*\w)(?:\.\{([\w,]+)\})?")  # a record of figures; `name.{md,json}`: both


def shipped_files() -> list[Path]:
    """What the repository holds (tracked, or new and not ignored): the wheel, the image and the docs are made
    of these."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [ROOT / name for name in out.splitlines() if (ROOT / name).is_file()]


def test_nothing_shipped_names_a_path_outside_the_repository() -> None:
    this = Path(__file__).resolve()
    named = []
    for path in shipped_files():
        if path == this or path.suffix in (".png", ".jar", ".class"):
            continue
        text = path.read_text(errors="replace")
        named += [f"{path.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}" for m in OUTSIDE.finditer(text)]
    assert not named, named


def test_every_record_of_figures_named_is_in_the_repository() -> None:
    """bench/results/ is ignored by git (a bench's output stays local until it is chosen): a record a document
    cites must have been added on purpose."""
    shipped = shipped_files()
    present = {str(path.relative_to(ROOT)) for path in shipped}
    named = {(str(path.relative_to(ROOT)), name) for path in shipped if path.suffix in (".md", ".py", ".toml", "")
             for m in RESULTS.finditer(path.read_text(errors="replace"))
             for name in ([f"{m[1]}.{ext}" for ext in m[2].split(",")] if m[2] else [m[1]])}
    missing = sorted(f"{where}: {name}" for where, name in named if name not in present)
    assert not missing, missing


def test_the_contract_names_every_category_and_command() -> None:
    missing = [str(c) for c in REGISTRY if f"`{c}`" not in CONTRACT]
    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    missing += [f"scrutiny {c}" for c in commands if f"`scrutiny {c}`" not in CONTRACT]
    assert not missing, missing
