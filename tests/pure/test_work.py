"""The cyclic collector around a range's work (`uncollected`)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from scrutiny.scan.work import uncollected


@pytest.fixture(autouse=True)
def _collector_restored() -> Iterator[None]:
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


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
