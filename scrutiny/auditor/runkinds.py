"""The kinds of run the auditor makes, and what each looks at (for the sinks: a kind that did not look reports
nothing stale)."""

from __future__ import annotations

from scrutiny.categories import REGISTRY, Category, Phase, in_phase

FULL, UNDERREPLICATION, RESCAN, WHATIF, DEEP = "full", "underreplication", "rescan", "whatif", "deep"


KINDS = (FULL, UNDERREPLICATION, RESCAN, WHATIF, DEEP)
PERIODIC = (FULL, UNDERREPLICATION, DEEP)
WHOLE_CLUSTER_KINDS = (FULL, UNDERREPLICATION, RESCAN, DEEP)  # the kinds whose runs set the gauges
JUDGING_KINDS = (FULL, RESCAN, DEEP)  # ... those of them that judge every ledger (the current state, lost bookies)


# What each kind of run looks at, for the sinks (a kind that did not look reports nothing stale).
CHECKED_BY_RUNS = tuple(c for c in REGISTRY
                        if c not in in_phase(Phase.WHATIF) + in_phase(Phase.DEEP) + in_phase(Phase.REPAIR))
KIND_CATEGORIES: dict[str, tuple[Category, ...]] = {
    FULL: CHECKED_BY_RUNS, RESCAN: CHECKED_BY_RUNS, UNDERREPLICATION: in_phase(Phase.MARKS), WHATIF: tuple(REGISTRY),
    DEEP: CHECKED_BY_RUNS + in_phase(Phase.DEEP)}

