"""A run's findings kept in SQLite (`scrutiny.findings`): what the driver's passes and the reports ask."""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import random
import threading

import pytest

from scrutiny import findings as findings_module
from scrutiny.categories import Category, worst_first
from scrutiny.checks import Violation
from scrutiny.findings import Findings
from scrutiny.pulsar.owners import UNKNOWN, Owner
from scrutiny.report import Report
from scrutiny.scan.context import Silences
from scrutiny.scan.engines import fetches

LESS = Category.LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY
DOWN = Category.BOOKIE_UNAVAILABLE
TOPIC = Owner("topic", "persistent://t/n/a")


def finding(cat: Category, lid: int, bookies: tuple[str, ...] = ("b1",), version: int = 3,
            owner: Owner | None = TOPIC, **details: object) -> Violation:
    return Violation(cat, lid, bookies, {"least_copies": 1, **details}, version, owner)


def test_one_finding_per_category_and_ledger_kept_as_it_was_given() -> None:
    lost = finding(LESS, 7, ("b1", "b2"), 4, None, lost_bookies=["b2"], under_covered=[{"copies": 1}])
    f = Findings([finding(LESS, 7), finding(DOWN, 7), lost])  # the later LESS replaces the first
    assert len(f) == 2 and f.counts() == {LESS: 1, DOWN: 1}
    assert [v for v in f.of_category(LESS)] == [lost]  # details, version, owner None (not known yet) round-trip
    assert list(f) == sorted(f, key=lambda v: (v.category, v.ledger_id))
    assert f.drop([7], only={DOWN}) == 1 and f.counts() == {LESS: 1}
    assert f.drop([7, 8]) == 1 and not f and list(f) == []


def test_iteration_and_ledger_chunks_survive_changes_between_chunks() -> None:
    f = Findings(finding(cat, lid, version=lid % 3) for lid in range(2500) for cat in (LESS, DOWN))
    assert [(v.category, v.ledger_id) for v in f] == [(c, lid) for c in sorted((LESS, DOWN)) for lid in range(2500)]
    seen = []
    for chunk in f.ledger_chunks({LESS}, chunk=100):
        seen += [lid for lid, _, _ in chunk]
        f.drop([lid for lid, _, _ in chunk if lid % 2])  # what _verify does between chunks
    assert seen == list(range(2500)) and f.counts() == {LESS: 1250, DOWN: 1250}
    f.add([finding(DOWN, 4, version=9)])  # a ledger's findings from two versions: the least and the most
    assert next(iter(f.ledger_chunks())) [:3] == [(0, 0, 0), (2, 2, 2), (4, 1, 9)]


def test_the_bookies_findings_name_and_count_as_gone() -> None:
    placed = {Category.PLACEMENT_POLICY_NOT_ADHERING}
    f = Findings([finding(DOWN, 1, ("b1", "b2")), finding(DOWN, 2, ("b3",)),
                  finding(LESS, 3, ("b1",), lost_bookies=["b4"]), finding(*placed, 5, ())])
    assert f.named(categories={DOWN}) == {"b1", "b2", "b3"} and f.named(lost=True) == {"b4"}
    assert f.naming({"b2"}, categories={DOWN}) == {1: ("b1", "b2")}
    assert f.naming({"b1"}) == {1: ("b1", "b2"), 3: ("b1",)}
    assert f.naming({"b4"}, lost=True) == {3: ("b4",)} and f.naming(set(), lost=True) == {}
    assert f.naming({"b9"}, categories=placed, or_none=True) == {5: ()}  # a placement finding naming no bookie


def test_owners_set_only_where_none_was_known() -> None:
    other = Owner("cursor", "persistent://t/n/b", "sub")
    f = Findings([finding(LESS, 1, owner=None), finding(DOWN, 1, owner=None), finding(LESS, 2, owner=other)])
    assert f.any_unowned() and f.topics({LESS, DOWN}) == set()
    assert [chunk for chunk in f.ledger_chunks(unowned=True)] == [[(1, 3, 3)]]
    f.set_owners({1: TOPIC, 2: TOPIC})
    assert not f.any_unowned() and f.topics({LESS}) == {TOPIC.name} and f.topics({Category.ORPHAN_LEDGER}) == set()
    assert {v.ledger_id: v.owner for v in f} == {1: TOPIC, 2: other}
    assert f.per_owner() == {TOPIC: {LESS: 1, DOWN: 1}, other: {LESS: 1}}
    assert Findings([finding(LESS, 1, owner=None)]).per_owner() == {UNKNOWN: {LESS: 1}}


def test_pages_worst_first_with_filters() -> None:
    cats = worst_first()[:4]
    f = Findings(finding(c, lid, (f"b{lid % 3}",), owner=Owner("topic", f"t{lid % 2}"))
                 for lid in range(30) for c in cats)
    total, page = f.worst(10, 5)
    assert total == 120 and [(v.category, v.ledger_id) for v in page] == [(cats[0], lid) for lid in range(5, 15)]
    total, page = f.worst(100, 0, category=str(cats[2]), topic="t1", bookie="b0")
    assert total == 5 and {v.ledger_id for v in page} == {3, 9, 15, 21, 27}
    assert [v.category for v in f.worst(10, ledger_id=4)[1]] == cats
    every = {str(c): 15 for c in cats}  # one row a topic, its total counting a ledger once
    assert f.per_topic(3) == [("t0", 15, every), ("t1", 15, every)]
    assert f.per_topic(1, category=str(cats[1]), bookie="b0") == [("t0", 5, {str(cats[1]): 5})]
    assert f.any_with_detail("least_copies") and not f.any_with_detail("unsafe_without")


def test_reports_read_their_findings_and_write_them_a_finding_at_a_time() -> None:
    found = [finding(DOWN, lid, owner=TOPIC if lid % 2 else None) for lid in range(3)] + [finding(LESS, 9)]
    report = Report("r", "s", "f", True, {"checked": 4}, Findings(found))
    out = io.StringIO()
    report.write_json(out)
    doc = json.loads(out.getvalue())
    assert doc == json.loads(json.dumps(report.to_json())) and len(doc["violations"]) == 4
    assert doc["counts"][str(DOWN)] == 3 and doc["owners"][0] == {**TOPIC.to_json(), "counts": {str(LESS): 1,
                                                                                             str(DOWN): 1}}
    assert Report.from_json(doc).to_json() == doc and report.exit_status() == 1
    assert "ledger 9" in report.render_text(worst=1) and "ledger 0" not in report.render_text(worst=1)
    empty = Report("r", "s", "f", True, {}, Findings())
    assert json.loads(empty.dumps())["violations"] == [] and empty.exit_status() == 0


def test_readers_in_other_threads_while_the_driver_writes() -> None:
    f = Findings()
    errors: list[BaseException] = []

    def read() -> None:
        try:
            for _ in range(200):
                seen = [v.ledger_id for v in f]  # each query whole: never a half-written finding
                assert seen == sorted(set(seen))
                f.worst(5)
        except BaseException as exc:
            errors.append(exc)

    readers = [threading.Thread(target=read) for _ in range(3)]
    for t in readers:
        t.start()
    for lid in range(300):
        f.add([finding(LESS, lid)])
        if lid % 3 == 0:
            f.drop([lid - 1], only={LESS})
    for t in readers:
        t.join()
    assert not errors and len(f) == 300 - 99


def test_results_fetched_from_the_executors_a_bounded_number_of_findings_at_a_time() -> None:
    assert list(fetches([3, 4, 0, 9, 20, 1, 1], 10)) == [[0, 1, 2], [3], [4], [5, 6]]
    assert list(fetches([0] * 2500, 10)) == [list(range(1000)), list(range(1000, 2000)), list(range(2000, 2500))]
    assert list(fetches([], 10)) == []


def test_silences_kept_compact_are_what_the_mappings_said() -> None:
    rng = random.Random(5)
    sets = [("b1",), ("b2", "b3"), ("b4",)]
    first = {rng.randrange(10_000): rng.choice(sets) for _ in range(3000)}
    more = {rng.randrange(10_000): rng.choice(sets) for _ in range(500)}
    s = Silences.of(first).plus(more)
    merged = {**first, **more}
    assert list(s) == sorted(merged) and len(s) == len(merged)
    assert all(s.get(lid) == merged.get(lid, ()) for lid in range(-1, 10_001))
    assert s.silent() == {b for bs in merged.values() for b in bs} and not Silences.of({})
    assert pickle.loads(pickle.dumps(s)).get(next(iter(more))) == more[next(iter(more))]



def test_findings_beyond_the_cache_spill_to_a_deleted_temporary_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(findings_module, "CACHE_KIB", 64)

    def spilled() -> list[str]:  # SQLite names its temporary files etilqs_*
        out = []
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(FileNotFoundError):  # the listing's own descriptor, closed meanwhile
                out += [t for t in [os.readlink(f"/proc/self/fd/{fd}")] if "etilqs_" in t]
        return out

    before = spilled()
    f = Findings(finding(LESS, lid, under_covered=[{"copies": 1, "entries": lid}]) for lid in range(5000))
    ours = [t for t in spilled() if t not in before]
    assert ours and all(t.endswith("(deleted)") for t in ours)  # nothing left behind, even by a process killed now
    assert [v.details["under_covered"][0]["entries"] for v in f] == list(range(5000))
    del f  # the file goes with the last reference, not at the next garbage collection
    assert spilled() == before
