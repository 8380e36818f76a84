"""The report of a run: the contract's JSON, a text rendering for people, and the exit status."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from scrutiny.categories import REGISTRY, Category, spec
from scrutiny.checks import Violation
from scrutiny.errors import EXIT_CLEAN, EXIT_INCOMPLETE, EXIT_VIOLATIONS


@dataclass
class Report:
    run_id: str
    started_at: str
    finished_at: str
    complete: bool
    ledgers: dict[str, int]
    violations: list[Violation]
    errors: list[str] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def counts(self) -> dict[str, int]:
        """Ledgers per category (a ledger counts once per category); every category present."""
        per = Counter(v.category for v in {(v.category, v.ledger_id): v for v in self.violations}.values())
        return {str(c): per.get(c, 0) for c in REGISTRY}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Report:
        violations = [Violation(Category(v["category"]), int(v["ledger_id"]), tuple(v.get("bookies", ())),
                                v.get("details", {})) for v in doc.get("violations", [])]
        return cls(doc["run_id"], doc["started_at"], doc["finished_at"], bool(doc["complete"]),
                   dict(doc.get("ledgers", {})), violations, list(doc.get("errors", [])), dict(doc.get("stats", {})))

    def exit_status(self) -> int:
        if not self.complete:
            return EXIT_INCOMPLETE
        if any(not spec(v.category).warning for v in self.violations):
            return EXIT_VIOLATIONS
        return EXIT_CLEAN

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "complete": self.complete,
            "ledgers": dict(self.ledgers),
            "counts": self.counts,
            "violations": [v.to_json() for v in self.violations],
            "errors": list(self.errors),
            "stats": dict(self.stats),
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=False)

    def render_text(self, worst: int = 20) -> str:
        lines = [f"scrutiny run {self.run_id}: {self.started_at} .. {self.finished_at}"
                 + ("" if self.complete else "  ** INCOMPLETE **")]
        lines.append("ledgers: " + ", ".join(f"{k} {v}" for k, v in self.ledgers.items()))
        lines.append("")
        lines.append(f"{'category':<40} {'ledgers':>8}")
        for cat, n in self.counts.items():
            mark = "" if n == 0 else ("  (warning)" if spec(Category(cat)).warning else "  <--")
            lines.append(f"{cat:<40} {n:>8}{mark}")
        if self.violations:
            lines.append("")
            lines.append(f"worst ledgers (at most {worst}):")
            order = list(REGISTRY)
            for v in sorted(self.violations, key=lambda v: (order.index(v.category), v.ledger_id))[:worst]:
                lines.append(f"  ledger {v.ledger_id}: {v.category}" + (f" bookies {', '.join(v.bookies)}"
                                                                       if v.bookies else ""))
                lines += ["    " + d for d in spec(v.category).describe(v.details)]
        if self.errors:
            lines.append("")
            lines.append("the run could not look at everything:")
            lines += [f"  {e}" for e in self.errors[:worst]]
        return "\n".join(lines) + "\n"
