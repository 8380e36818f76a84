"""The house's rules, held against the code: one concept a room reads alone (no file over 600 lines, no class
over 300), and no room reaches into another's private names."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def sources(*folders: str) -> list[Path]:
    return [p for f in folders for p in sorted((ROOT / f).rglob("*.py"))
            if not p.name.endswith(("_pb2.py", "_pb2_grpc.py"))]


def test_no_file_is_over_600_lines_and_no_class_over_300() -> None:
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in sources("scrutiny")
            if (n := len(p.read_text().splitlines())) > 600]
    for path in sources("scrutiny"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and (node.end_lineno or 0) - node.lineno + 1 > 300:
                long.append(f"{path.relative_to(ROOT)}:{node.name}")
    assert not long


def test_no_private_name_is_imported_across_rooms() -> None:
    crossing = []
    for path in sources("scrutiny", "bench"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(("scrutiny", "bench")):
                crossing += [f"{path.relative_to(ROOT)}: {node.module}.{a.name}" for a in node.names
                             if a.name.startswith("_") and not a.name.startswith("__")]
    assert not crossing


def backticked(text: str) -> list[str]:
    return re.findall(r"`([^`\s]+)`", text)


def test_the_architecture_doc_names_every_room_and_every_file_it_sends_a_change_to() -> None:
    """docs/architecture.md: every module of the package is named in it (its rooms, by name or by path), and every
    path it names in "Where to add" exists (a change it sends somewhere can be made there)."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    names = {part.removesuffix(".py") for token in backticked(doc) for part in token.strip("()").split("/")}
    unnamed = [str(p.relative_to(ROOT)) for p in sources("scrutiny") if p.stem != "__init__" and p.stem not in names]
    assert not unnamed
    where = doc[doc.index("## Where to add"):doc.index("## Tests")]
    paths = {token.split("::")[0].strip("()") for token in backticked(where) if token.endswith((".py", "/"))
             or ("/" in token and "." in token.split("/")[-1])}
    gone = sorted(p for p in paths if not any((base / p).exists() for base in (ROOT, ROOT / "scrutiny")))
    assert paths and not gone


def imports_of(path: Path) -> set[str]:
    """The scrutiny modules a file imports (anywhere in it: a lazy or a type-checking import ties rooms too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names if a.name.startswith("scrutiny")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("scrutiny") and not node.level:
            module = node.module or ""
            for a in node.names:  # a submodule if there is one by that name, else the module itself
                sub = f"{module}.{a.name}"
                names.add(sub if (ROOT / Path(*sub.split("."))).with_suffix(".py").exists() else module)
    return names


def module_graph() -> dict[str, set[str]]:
    graph = {}
    for path in sources("scrutiny"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        graph[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = imports_of(path)
    return {m: {i for i in imports if i in graph and i != m} for m, imports in graph.items()}


def test_no_circle_of_imports() -> None:
    graph, circles = module_graph(), []
    for start in graph:  # a module reached again from itself
        stack, seen = [(start, [start])], set()
        while stack:
            module, path = stack.pop()
            for nxt in graph[module]:
                if nxt == start:
                    circles.append(" -> ".join([*path, start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    assert not circles


def test_the_auditor_and_its_console_meet_at_one_face() -> None:
    """The console reads one module of the auditor (`auditor/face.py`); the auditor imports nothing of the console
    but in its composition root (`auditor/main.py`), which serves the console beside /metrics."""
    graph = module_graph()
    console_reads = {i for m, imports in graph.items() if m.startswith("scrutiny.console") for i in imports
                     if i.startswith("scrutiny.auditor")}
    assert console_reads == {"scrutiny.auditor.face"}
    auditor_reads = {(m, i) for m, imports in graph.items() if m.startswith("scrutiny.auditor") for i in imports
                     if i.startswith("scrutiny.console")}
    assert {m for m, _ in auditor_reads} <= {"scrutiny.auditor.main"}
