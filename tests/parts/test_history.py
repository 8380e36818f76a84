"""Whatever the agent's history, its answers are what is on the bookie's disk now: an entry whose entry log is
not there is not served, whether the agent watched the log go, was restarted after, or was down when it went;
a bookie formatted while its agent was down is read as it is; what an earlier agent left in the scratch
directory is never read. Each case is held to a fresh agent that never ran before, and a seeded property test
holds a long-lived agent, restarted at random, to a fresh one and to a model of the bookie after any sequence of
what a bookie does (writes, rolled and compacted logs, deletes, flushes, restarts, a format) and of losses."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from scrutiny import entrylog
from scrutiny.entrysources import DbLedgerStorageSource, SourceError
from scrutiny.testing.clusterwriter import cookie
from scrutiny.testing.dbledgerstorage import EntryLog, LiveBookie
from tests.parts.conftest import stored


def answers(source: DbLedgerStorageSource, ledger_ids: range | list[int]) -> dict[int, list[int] | None]:
    """Each ledger's entries as the source would serve them after catching up (None: no such ledger)."""
    source.refresh()
    out: dict[int, list[int] | None] = {}
    for lid in ledger_ids:
        got = source.entry_ids(lid)
        out[lid] = None if got is None else got[0].tolist()
    return out


def fresh(path: Path, tmp_path: Path, ledger_ids: range | list[int]) -> dict[int, list[int] | None]:
    """What an agent that never ran before answers."""
    source = DbLedgerStorageSource([path], tmp_path / f"fresh-{random.random()}")
    try:
        return answers(source, ledger_ids)
    finally:
        source.close()


ALL = list(range(1, 8))
WHOLE = {lid: list(range(10)) for lid in range(1, 7)} | {7: None}


def test_a_log_removed_under_an_agent_that_never_looked_is_not_served(bookie: tuple[Path, LiveBookie],
                                                                     tmp_path: Path) -> None:
    """No watch ever ran (an agent without continuous scrutiny, or before its first look): the answer alone
    finds the log gone."""
    path, _ = bookie
    source = DbLedgerStorageSource([path], tmp_path / "scratch")
    try:
        assert answers(source, ALL) == WHOLE
        entrylog.log_path(path, 1).unlink()
        assert answers(source, ALL) == {**WHOLE, 1: [], 2: [], 3: []} == fresh(path, tmp_path, ALL)
    finally:
        source.close()


def test_an_agent_restarted_after_a_log_went_still_leaves_its_entries_out(bookie: tuple[Path, LiveBookie],
                                                                          tmp_path: Path) -> None:
    """The case tried on real bookies: the agent watched the log go, then was restarted (the same command line,
    the same scratch directory); and a log removed while the agent was down."""
    path, _ = bookie
    scratch = tmp_path / "scratch"
    source = DbLedgerStorageSource([path], scratch)
    source.changes()  # watching: it takes stock
    entrylog.log_path(path, 1).unlink()
    source.changes()  # ... and sees log 1 go
    source.close()
    source = DbLedgerStorageSource([path], scratch)
    try:
        assert answers(source, ALL) == {**WHOLE, 1: [], 2: [], 3: []}
    finally:
        source.close()
    entrylog.log_path(path, 3).unlink()  # while the agent is down: the log being written
    source = DbLedgerStorageSource([path], scratch)
    try:
        assert answers(source, ALL) == {**WHOLE, 1: [], 2: [], 3: [], 6: []} == fresh(path, tmp_path, ALL)
    finally:
        source.close()


def test_a_log_compacted_away_is_served_from_where_its_entries_went(bookie: tuple[Path, LiveBookie],
                                                                   tmp_path: Path) -> None:
    """Compaction moves a log's entries, then removes the log: an agent that caught up before the move and lists
    the logs after the removal looks again, and serves the entries from their new log."""
    path, live = bookie
    source = DbLedgerStorageSource([path], tmp_path / "scratch")
    try:
        assert answers(source, ALL) == WHOLE
        source.refresh()  # the index as it was before the move
        live.compact(path, 2, EntryLog(path, 4))
        assert {lid: source.entry_ids(lid)[0].tolist() for lid in (4, 5)} == {4: WHOLE[4], 5: WHOLE[5]}  # type: ignore
    finally:
        source.close()


def test_a_bookie_formatted_while_its_agent_was_down_is_read_as_it_is(bookie: tuple[Path, LiveBookie],
                                                                     tmp_path: Path) -> None:
    """The agent killed (its scratch views left behind), the bookie's directories replaced by another instance's
    (formatted, other ledgers in them), the agent started again on the same scratch directory."""
    path, live = bookie
    scratch = tmp_path / "scratch"
    source = DbLedgerStorageSource([path], scratch)
    assert answers(source, ALL) == WHOLE
    # killed: nothing of it is closed or cleaned (its views of the old indexes stay in the scratch directory)
    live.close()
    shutil.rmtree(path / "current")
    other = LiveBookie(path)
    log = EntryLog(path, 0)
    for lid in (2, 7):
        other.write(lid, {e: stored(lid, e) for e in range(3)}, log)
    other.flush()
    (path / "current" / "VERSION").write_bytes(cookie("127.0.8.1:3181", "two"))
    assert any(scratch.iterdir())
    restarted = DbLedgerStorageSource([path], scratch)
    try:
        want = {lid: None for lid in ALL} | {2: [0, 1, 2], 7: [0, 1, 2]}
        assert answers(restarted, ALL) == want == fresh(path, tmp_path, ALL)
    finally:
        restarted.close()
        other.close()


@pytest.mark.parametrize("seed", range(6))
def test_any_history_then_the_agent_answers_as_one_that_never_ran(tmp_path: Path, seed: int) -> None:
    """A bookie's life at random (ledgers written into the current entry log, logs rolled over, compacted,
    ledgers deleted and their locations cleaned up, memtables flushed, the bookie restarted or formatted) and
    losses (any entry log removed, the one being written too), while one agent runs, looks (its watch), is
    stopped for a while or restarted at random: at every check its answers equal a model of the bookie's disk,
    and a fresh agent's."""
    rng = random.Random(seed)
    path = tmp_path / "bookie"
    scratch = tmp_path / "scratch"
    live = LiveBookie(path)
    logs = {1: EntryLog(path, 1)}  # open logs (the last one is the one being written)
    current, next_log, next_ledger = 1, 2, 1
    entries: dict[int, dict[int, int]] = {}  # ledger -> entry -> log, as the `locations` index has it
    held: set[int] = set()  # as the `ledgers` index has it
    present = {1}
    source: DbLedgerStorageSource | None = DbLedgerStorageSource([path], scratch)
    checks = 0

    def roll() -> None:
        nonlocal current, next_log
        if current in present:
            logs[current].finish()
        current, next_log = next_log, next_log + 1
        logs[current] = EntryLog(path, current)
        present.add(current)

    try:
        for _ in range(140):
            op = rng.choice(["write", "write", "write", "roll", "delete", "cleanup", "compact", "lose", "flush",
                             "restart bookie", "agent down", "agent up", "look", "check", "check", "format"])
            if op == "write":
                lid, next_ledger = next_ledger, next_ledger + 1
                if current not in present:
                    roll()
                n = rng.randint(1, 6)
                live.write(lid, {e: stored(lid, e) for e in range(n)}, logs[current])
                entries[lid] = dict.fromkeys(range(n), current)
                held.add(lid)
            elif op == "roll":
                roll()
            elif op == "delete" and held:
                lid = rng.choice(sorted(held))
                live.delete(lid)
                held.discard(lid)
            elif op == "cleanup":
                for lid in [lid for lid in entries if lid not in held]:
                    live.cleanup(lid)
                    del entries[lid]
            elif op == "compact":
                finished = sorted(present - {current})
                if finished:
                    old = rng.choice(finished)
                    new, next_log = next_log, next_log + 1
                    live.compact(path, old, EntryLog(path, new))
                    present.discard(old)
                    present.add(new)
                    for where in entries.values():
                        for e, log_id in where.items():
                            if log_id == old:
                                where[e] = new
            elif op == "lose" and present:
                gone = rng.choice(sorted(present))
                entrylog.log_path(path, gone).unlink()
                present.discard(gone)
            elif op == "flush":
                live.flush()
            elif op == "restart bookie":
                live.close()
                live = LiveBookie(path)
                roll()  # a bookie starts a new entry log
            elif op == "format":
                live.close()
                shutil.rmtree(path / "current")
                live = LiveBookie(path)
                (path / "current" / "VERSION").write_bytes(cookie("127.0.8.1:3181", f"format-{rng.random()}"))
                entries.clear()
                held.clear()
                present.clear()
                logs.clear()
                roll()
            elif op == "agent down" and source is not None:
                source.close() if rng.random() < 0.5 else None  # a clean stop, or killed (left as it is)
                source = None
            elif op == "agent up" and source is None:
                source = DbLedgerStorageSource([path], scratch)
            elif op == "look" and source is not None:
                source.changes() if rng.random() < 0.7 else source.unwatched()
            elif op == "check" and source is not None:
                ids = list(range(1, next_ledger + 1))
                model = {lid: ([e for e, log_id in sorted(entries.get(lid, {}).items()) if log_id in present]
                               if lid in held else None) for lid in ids}
                assert answers(source, ids) == model, (seed, checks)
                assert fresh(path, tmp_path, ids) == model, (seed, checks)
                checks += 1
        assert checks
    finally:
        if source is not None:
            source.close()
        live.close()


def test_indexes_kept_apart_from_the_entry_logs_are_read_with_them(tmp_path: Path) -> None:
    """A bookie with indexDirectories: its indexes in one directory, its entry logs in its ledger directory; the
    agent reads the one and holds it against the other (`--index-dir` beside each `--ledger-dir`)."""
    ledgers, index = tmp_path / "ledgers", tmp_path / "index"
    with LiveBookie(index) as live:
        log = EntryLog(ledgers, 1)
        for lid in (1, 2):
            live.write(lid, {e: stored(lid, e) for e in range(4)}, log)
        log.finish()
        live.flush()
    source = DbLedgerStorageSource([ledgers], tmp_path / "scratch", index_dirs=[index])
    try:
        assert answers(source, [1, 2, 3]) == {1: [0, 1, 2, 3], 2: [0, 1, 2, 3], 3: None}
        entrylog.log_path(ledgers, 1).unlink()
        assert answers(source, [1, 2, 3]) == {1: [], 2: [], 3: None}
    finally:
        source.close()
    with pytest.raises(SourceError, match="one to one"):
        DbLedgerStorageSource([ledgers, tmp_path / "other"], tmp_path / "scratch", index_dirs=[index])
