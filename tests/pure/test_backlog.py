"""Continuous scrutiny's backlog: a lane's loop is woken only for a look due sooner than it planned to wake."""

from __future__ import annotations

import math
from collections import Counter

from scrutiny.auditor.backlog import BOOKIES, LANES, LEDGERS, Backlog


def backlog() -> tuple[Backlog, Counter[str]]:
    pokes: Counter[str] = Counter()
    return Backlog({lane: (lambda lane=lane: pokes.update([lane])) for lane in LANES}), pokes


def test_a_loop_that_never_planned_is_woken_by_every_add() -> None:
    b, pokes = backlog()
    b.add([1], 5_000, "closed")
    b.add([2], 9_000, "closed")
    assert pokes[LEDGERS] == 2


def test_an_idle_loop_is_woken_by_anything_and_a_sleeping_one_only_for_sooner_looks() -> None:
    b, pokes = backlog()
    assert b.sleep_ms(LEDGERS, 1_000, -math.inf) is None  # nothing due: until poked
    b.add([1], 11_000, "closed")  # after the write-cache grace
    assert pokes[LEDGERS] == 1
    assert b.sleep_ms(LEDGERS, 1_000, -math.inf) == 10_000
    b.add([2], 12_000, "closed")  # later than the planned wake: taken then
    b.add([1], 1_500, "gone from a bookie")  # already waiting, and kept at its later time
    assert pokes[LEDGERS] == 1
    b.add([3], 2_000, "gone from a bookie")  # sooner: the loop wakes to sleep less
    assert pokes[LEDGERS] == 2
    assert b.sleep_ms(LEDGERS, 1_500, -math.inf) == 500
    assert b.take(LEDGERS, 2_000)[0].keys() == {3}
    assert b.sleep_ms(LEDGERS, 2_000, -math.inf) == 9_000


def test_the_batch_interval_holds_the_loop_back_and_so_does_not_wake_it() -> None:
    b, pokes = backlog()
    b.add([1], 1_000, "gone")
    pokes.clear()
    # a look just done: the next one not before 11_000, whatever is due
    assert b.sleep_ms(LEDGERS, 1_000, 11_000) == 10_000
    b.add([2], 3_000, "gone")
    assert not pokes
    assert b.take(LEDGERS, 11_000)[0].keys() == {1, 2}
    assert b.sleep_ms(LEDGERS, 11_000, 21_000) is None  # idle: the next add wakes it at once
    b.add([4], 12_000, "gone")
    assert pokes[LEDGERS] == 1


def test_lanes_plan_apart() -> None:
    b, pokes = backlog()
    b.add_named(BOOKIES, "bookie-1:3181", 60_000, "registration went away")
    assert b.sleep_ms(BOOKIES, 0, -math.inf) == 60_000
    assert b.sleep_ms(LEDGERS, 0, -math.inf) is None
    pokes.clear()
    b.add_named(BOOKIES, "bookie-2:3181", 90_000, "registration went away")
    b.add([7], 5_000, "closed")
    assert pokes == Counter({LEDGERS: 1})
    b.add_named(BOOKIES, "bookie-3:3181", 1_000, "registered again")
    assert pokes == Counter({LEDGERS: 1, BOOKIES: 1})
