"""The report of a run: the contract's JSON, a text rendering for people, and the exit status."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from typing import Any, TextIO

from scrutiny.categories import REGISTRY, Category, spec, worst_first
from scrutiny.checks import Violation
from scrutiny.checks.remedy import RepairContext, remedy
from scrutiny.errors import EXIT_CLEAN, EXIT_INCOMPLETE, EXIT_VIOLATIONS
from scrutiny.findings import Findings
from scrutiny.pulsar.owners import Owner
from scrutiny.runstats import Deep


@dataclass
class Report:
    run_id: str
    started_at: str
    finished_at: str
    complete: bool
    ledgers: dict[str, int]
    violations: Findings  # on disk beyond a few MB: a report may have millions
    errors: list[str] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)  # the figures of its parts (runstats), flat
    # full runs: {"bookies": {id: figures}, "racks": {...}}, figures of what would fall below AQ were it down
    blast_radius: dict[str, dict[str, dict[str, int]]] | None = None
    repair: RepairContext = field(default_factory=RepairContext)  # what each finding's remedy depends on
    # ledgers the run could not settle (silences not confirmed, facts that kept changing): it says nothing of them
    unsettled: frozenset[int] = frozenset()

    def finding_json(self, v: Violation) -> dict[str, Any]:
        """A finding as the report gives it: with its remedy under this run's repair context."""
        return {**v.to_json(), "remedy": remedy(v, self.repair).to_json()}

    @property
    def counts(self) -> dict[Category, int]:
        """Ledgers per category (a ledger counts once per category); every category present."""
        per = self.violations.counts()
        return {c: per.get(c, 0) for c in REGISTRY}

    @property
    def owners(self) -> list[dict[str, Any]]:
        """One row per owner (topic, cursor, ...) with its ledgers per category, worst first."""
        per: dict[Owner, dict[Category, int]] = self.violations.per_owner()
        order = worst_first()
        rows = sorted(per.items(), key=lambda kv: ([-kv[1].get(c, 0) for c in order], kv[0]))
        return [{**owner.to_json(), "counts": {str(c): n for c, n in sorted(cats.items(),
                                                                          key=lambda ck: order.index(ck[0]))}}
                for owner, cats in rows]

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Report:
        violations = Findings(Violation.from_json(v) for v in doc.get("violations", []))
        return cls(doc["run_id"], doc["started_at"], doc["finished_at"], bool(doc["complete"]),
                   dict(doc.get("ledgers", {})), violations, list(doc.get("errors", [])), dict(doc.get("stats", {})),
                   doc.get("blast_radius"), RepairContext.from_json(doc.get("repair", {})))

    def exit_status(self) -> int:
        if not self.complete:
            return EXIT_INCOMPLETE
        if any(not spec(c).warning for c in self.violations.counts()):
            return EXIT_VIOLATIONS
        return EXIT_CLEAN

    def whatif_exit_status(self) -> int:
        """A what-if: 1 unsafe (some entry would fall below its ack quorum, or further below it), 0 safe,
        2 could not tell (incomplete, or some ledger's copies are unknown today)."""
        found = self.violations.counts()
        if any(spec(c).unsafe for c in found) or self.violations.any_with_detail("unsafe_without"):
            return EXIT_VIOLATIONS
        unknown = {Category.BOOKIE_UNAVAILABLE, Category.INVALID_BOOKIE_RESPONSE, Category.INVALID_METADATA}
        if not self.complete or unknown & found.keys():
            return EXIT_INCOMPLETE
        return EXIT_CLEAN

    def to_json(self, violations: bool = True) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "complete": self.complete,
            "ledgers": dict(self.ledgers),
            "counts": self.counts,
            "owners": self.owners,
            "errors": list(self.errors),
            "stats": dict(self.stats),
            "repair": self.repair.to_json(),
            **({"blast_radius": self.blast_radius} if self.blast_radius is not None else {}),
            **({"violations": [self.finding_json(v) for v in self.violations]} if violations else {}),
        }

    def write_json(self, out: TextIO) -> None:
        """The report's JSON written a finding at a time, one per line: a run with a million findings
        never becomes one string (whole, its JSON took about 6 KB of memory per finding at its peak)."""
        head = json.dumps(self.to_json(violations=False), indent=2)
        out.write(head[:-2] + ',\n  "violations": [')
        first = True
        for v in self.violations:
            out.write(("\n    " if first else ",\n    ") + json.dumps(self.finding_json(v)))
            first = False
        out.write("]\n}\n" if first else "\n  ]\n}\n")

    def dumps(self) -> str:
        out = io.StringIO()
        self.write_json(out)
        return out.getvalue()

    def render_text(self, worst: int = 20) -> str:
        lines = [f"scrutiny run {self.run_id}: {self.started_at} .. {self.finished_at}"
                 + ("" if self.complete else "  ** INCOMPLETE **")]
        at_risk = [o for o in self.owners if o["kind"] != "unknown"]
        if at_risk:
            lines.append("")
            lines.append(f"at risk (worst first, at most {worst}):")
            for o in at_risk[:worst]:
                what = o["name"] + (f" cursor {o['cursor']}" if o.get("cursor") else "")
                lines.append(f"  {o['kind']:<15} {what}: " + ", ".join(f"{c} {n}" for c, n in o["counts"].items()))
        lines.append("")
        lines.append("ledgers: " + ", ".join(f"{k} {v}" for k, v in self.ledgers.items()))
        deep = Deep.given(self.stats)
        if deep is not None:
            lines.append(f"deep scrub: {deep.deep_ledgers_verified} ledgers, {deep.deep_entries_verified} entries "
                         f"({deep.deep_bytes_read:,} bytes) verified, {deep.deep_entries_corrupt} corrupt copies, "
                         f"{deep.deep_copies_unverified} copies not verifiable")
        lines.append("")
        lines.append(f"{'category':<40} {'ledgers':>8}")
        for cat, n in self.counts.items():
            mark = "" if n == 0 else ("  (warning)" if spec(Category(cat)).warning else "  <--")
            lines.append(f"{cat:<40} {n:>8}{mark}")
        if self.violations:
            lines.append("")
            lines.append(f"worst ledgers (at most {worst}):")
            for v in self.violations.worst(worst)[1]:
                owner = f" ({v.owner.kind} {v.owner.name})" if v.owner and v.owner.kind != "unknown" else ""
                lines.append(f"  ledger {v.ledger_id}{owner}: {v.category}"
                             + (f" bookies {', '.join(v.bookies)}" if v.bookies else ""))
                lines += ["    " + d for d in spec(v.category).describe(v.details)]
                lines += ["    " + d for d in remedy(v, self.repair).lines()]
        if self.errors:
            lines.append("")
            lines.append("the run could not look at everything:")
            lines += [f"  {e}" for e in self.errors[:worst]]
        return "\n".join(lines) + "\n"
