"""The cyclic collector around a range's work (`uncollected`) and between a Spark worker's tasks (`BetweenTasks`)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from scrutiny.scan.work import BetweenTasks, uncollected


@pytest.fixture(autouse=True)
def _collector_restored() -> Iterator[None]:
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()
    gc.unfreeze()


def test_the_collector_is_off_for_a_range_and_on_after_it_even_when_the_range_fails() -> None:
    gc.enable()
    with uncollected():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), uncollected():
        raise RuntimeError("a range that fails")
    assert gc.isenabled()


def test_ranges_that_overlap_leave_it_on_once_the_first_ends_and_off_if_it_was_off() -> None:
    gc.enable()
    first, second = uncollected(), uncollected()
    first.__enter__()
    second.__enter__()  # finds it off
    first.__exit__(None, None, None)
    assert gc.isenabled()  # never off longer than a range
    second.__exit__(None, None, None)
    assert gc.isenabled()
    gc.disable()  # an embedding process that runs without it
    with uncollected():
        pass
    assert not gc.isenabled()


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> tuple[_Node, weakref.ref[_Node]]:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return a, weakref.ref(b)


def _tracked(obj: object) -> bool:
    """Is `obj` in the collector's sight (frozen objects are not)?"""
    return any(o is obj for o in gc.get_objects())


def test_what_a_task_keeps_is_frozen_what_it_left_in_cycles_is_collected_first() -> None:
    gc.disable()  # no collection but the ones `ended` makes
    between = BetweenTasks()
    kept, _ = _cycle()
    garbage, gone = _cycle()
    del garbage
    between.ended()
    assert gone() is None  # collected, not frozen for the process's life
    assert not _tracked(kept)  # out of sight of the daemon's collection after each task
    assert gc.get_freeze_count() > 0


def test_a_cycle_among_kept_objects_is_collected_at_the_next_full_collection() -> None:
    gc.disable()
    between = BetweenTasks()
    kept, gone = _cycle()
    between.ended()
    del kept  # a retired session's cycle, frozen with it
    for _ in range(between.FULL_EVERY - 2):
        between.ended()
        assert gone() is not None  # frozen: no collection sees it
    between.ended()
    assert gone() is None
