"""A run's figures (scrutiny/runstats.py): each name in one part only, documented, added up as ranges merge,
read back tolerantly from a report of any version."""

from __future__ import annotations

from pathlib import Path

import pytest

from scrutiny.runstats import EVERY_RUN, PARTS, Deep, Holdings, RunFigures, Scan, StoreUse, Timings

ROOT = Path(__file__).resolve().parents[2]


def test_each_figure_is_named_by_one_part_and_documented() -> None:
    names = [n for part in PARTS for n in part.names()]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    docs = "".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    assert [n for n in names if f"`{n}`" not in docs] == []


def test_figures_add_up_as_ranges_merge() -> None:
    run = RunFigures()
    run.add(Scan(bookie_calls_failed=2).nonzero(), StoreUse(store_reads=10, store_peak_in_flight=7).nonzero())
    run.add(Scan(bookie_calls_failed=1, potentially_faulty=3), StoreUse(store_reads=5, store_peak_in_flight=4))
    assert Scan.of(run).bookie_calls_failed == 3 and Scan.of(run).potentially_faulty == 3
    assert StoreUse.of(run) == StoreUse(store_reads=15, store_peak_in_flight=7)  # a peak is the largest
    assert "rechecked_again" not in run  # nothing happened: nothing added
    with pytest.raises(ValueError, match="no run figure is named 'bookie_calls_failled'"):
        run.add({"bookie_calls_failled": 1})


def test_a_report_has_every_figure_of_its_parts_and_reads_back_whatever_its_version() -> None:
    run = RunFigures()
    run.add(Timings(first_pass_ms=1500), Holdings(orphan_candidates=2))
    stats = run.report(EVERY_RUN)
    assert set(stats) == {n for part in EVERY_RUN for n in part.names()} | {"orphan_candidates"}
    assert stats["verify_ms"] == 0 and Timings.of(stats).phases() == {"first_pass": 1500, "recheck": 0, "verify": 0}
    assert Deep.given(stats) is None and Holdings.given(stats) == Holdings(orphan_candidates=2)
    newer = {**stats, "a_figure_of_a_newer_version": 4}
    assert Scan.of(newer) == Scan.of(stats) and Deep.of({}) == Deep()
