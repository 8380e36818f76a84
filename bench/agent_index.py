"""The bookie agent against a bookie's real index: CPU per entry listed, against RocksDB's own iteration
measured in the same run, and against the agent's keys-only path (before its answers held each entry's
location against the entry logs there).

The index is a DbLedgerStorage `locations` RocksDB with BookKeeper's options for it (LZ4, 64 KiB blocks,
a 10-bit bloom filter, format_version 5, dynamic level sizes; `KeyValueStorageRocksDB`), write buffer and
SST size scaled down (4 MiB) so that 10M keys make several files on several levels as a bigger bookie's
index has; keys written interleaved across ledgers, in time order, as a bookie flushes them; compactions
left to settle; then the last 1% written and not flushed (a live bookie's memtable, read from its WAL),
with the primary still open while the agents read. Its `ledgers` index lists every ledger.

- **native floor**: `bench/index_floor.c`, built here against Debian's librocksdb (`librocksdb-dev`):
  the same index opened as a secondary with the agent's block cache, each ledger's keys iterated to its
  upper bound, each entry's id and its location's entry log decoded; the CPU of its second pass (warm, as the
  agent's);
- **the agent** (`scrutiny bookie-agent`'s source and server, its own process): every ledger answered
  through the streaming call, 1,000 ledgers a call as a scan asks; its process CPU per entry listed, gRPC
  and encoding included (each entry's key and location read in one pass, the entry logs they name held
  against those in the directory, listed at each call); and the same for the keys-only path (the entry ids
  only, every entry listed counted as served, whatever its log: the path before). The floor and both agents
  are measured in alternation, --rounds times; each ratio is the median of the rounds' ratios;
- **unary**: the agent's CPU per BP-34 one-ledger call (a ledger it does not hold: the catch-up is the
  cost), catching up at every call (before) and at most every 0.2 s (now);
- **budget**: the full listing again, three times, with `entries_per_second` set to a third of the agent's
  unbounded rate (measured just before), and the rate it then listed at (the limit lets 0.1 s of credit
  build up while idle, so a short listing may go faster than the budget by that much);
- **RSS**: the agent's after a full listing, at each index size.

    python -m bench.agent_index [--keys 2000000,10000000,20000000] [--ledgers 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench.common import table
from scrutiny.agent import BookieAgent
from scrutiny.bookieclient import BookieClient, EndpointResolver
from scrutiny.entrylog import log_path
from scrutiny.entrysources.dbledgerstorage import INDEX_CACHE_BYTES, DbLedgerStorageSource
from scrutiny.entrysources.layout import ENTRY_KEY, LEDGER_KEY
from scrutiny.testing import processes
from scrutiny.testing.dbledgerstorage import ledger_data, log_header

BOOKIE = "127.0.7.1:3181"
FLOOR_SOURCE = Path(__file__).with_name("index_floor.c")
LOCATION_LOG = 1
LOCATION = struct.pack(">q", (LOCATION_LOG << 32) | 1024)


def bookkeeper_options() -> Any:
    from rocksdict import BlockBasedOptions, DBCompressionType, Options

    o = Options(raw_mode=True)
    o.create_if_missing(True)
    o.set_compression_type(DBCompressionType.lz4())
    o.set_write_buffer_size(4 << 20)
    o.set_max_write_buffer_number(4)
    o.set_target_file_size_base(4 << 20)
    o.set_max_bytes_for_level_base(16 << 20)
    o.set_level_zero_file_num_compaction_trigger(4)
    o.set_level_compaction_dynamic_level_bytes(True)
    t = BlockBasedOptions()
    t.set_block_size(64 * 1024)
    t.set_format_version(5)
    t.set_bloom_filter(10, False)
    t.set_cache_index_and_filter_blocks(True)
    o.set_block_based_table_factory(t)
    return o


class LiveIndex:
    """A bookie's two indexes, written as it writes them and kept open (the primary) while agents read."""

    def __init__(self, ledger_dir: Path, keys: int, ledgers: int) -> None:
        from rocksdict import Rdict, WriteBatch

        current = ledger_dir / "current"
        current.mkdir(parents=True)
        log_path(ledger_dir, LOCATION_LOG).write_bytes(log_header())  # the entry log every location points into
        self.ids = 1_000_000 + np.arange(ledgers, dtype=np.int64) * 37
        self.ledgers = Rdict(str(current / "ledgers"), options=bookkeeper_options())
        for lid in self.ids.tolist():
            self.ledgers[LEDGER_KEY.pack(lid)] = ledger_data()
        self.ledgers.flush()
        self.locations = Rdict(str(current / "locations"), options=bookkeeper_options())
        per = keys // ledgers
        unflushed = per - max(1, per // 100)
        for entry in range(per):
            if entry == unflushed:  # the rest stays in the memtable (and the WAL), as a live bookie's does
                self.locations.flush()
                self._settle()
            rows = np.empty((ledgers, 2), dtype=">i8")
            rows[:, 0], rows[:, 1] = self.ids, entry
            raw = rows.tobytes()
            batch = WriteBatch(raw_mode=True)
            for i in range(ledgers):
                batch.put(raw[16 * i:16 * i + 16], LOCATION)
            self.locations.write(batch)
        self.keys = per * ledgers
        levels = self.locations.property_value("rocksdb.levelstats") or ""
        per_level = {f"L{r.split()[0]}": int(r.split()[1]) for r in levels.splitlines()[2:] if int(r.split()[1])}
        self.files = " ".join(f"{lv}:{n}" for lv, n in per_level.items())

    def _settle(self) -> None:
        while (self.locations.property_int_value("rocksdb.compaction-pending")
               or self.locations.property_int_value("rocksdb.num-running-compactions")):
            time.sleep(0.1)

    def close(self) -> None:
        self.ledgers.close()
        self.locations.close()


class Floor:
    """RocksDB's own iteration with the agent's block cache (bench/index_floor.c, built here against
    Debian's librocksdb): one pass's CPU seconds after a warm-up pass, a fresh process each time."""

    def __init__(self, index_dir: Path, ids: list[int], scratch: Path) -> None:
        self.binary = scratch / "index_floor"
        processes.run(["gcc", "-O2", "-o", str(self.binary), str(FLOOR_SOURCE), "-lrocksdb"], check=True)
        self.args = [str(index_dir / "current" / "locations"), str(INDEX_CACHE_BYTES >> 20), "2", *map(str, ids)]
        self.scratch = scratch

    def listing(self) -> tuple[int, float]:
        secondary = tempfile.mkdtemp(dir=self.scratch)
        out = processes.run([str(self.binary), self.args[0], secondary, *self.args[1:]], check=True,
                             capture_output=True, text=True).stdout
        listed, seconds = out.splitlines()[-1].split()
        return int(listed), float(seconds)


class KeysOnlyPath(DbLedgerStorageSource):
    """The agent's path before its answers held each entry's location against the entry logs there: keys only,
    every entry listed counted as served (kept here as the same run's baseline)."""

    def _served(self, d: int, ledger_id: int) -> np.ndarray:
        keys = self.indexes[d][1].keys_between(ENTRY_KEY.pack(ledger_id, 0), ENTRY_KEY.pack(ledger_id, -(1 << 63)))
        return np.frombuffer(keys, dtype=">i8")[1::2].astype(np.int64)


def serve(ledger_dir: str, scratch: str, keys_only: bool, entries_per_second: float, unary_catch_up: float) -> None:
    """An agent process (the bench's subprocess): prints its port, serves until stdin closes."""
    source = (KeysOnlyPath if keys_only else DbLedgerStorageSource)([ledger_dir], scratch)
    agent = BookieAgent(source, bind="127.0.0.1:0", workers=4, entries_per_second=entries_per_second,
                        unary_catch_up_seconds=unary_catch_up).start()
    print(agent.port, flush=True)
    sys.stdin.read()
    agent.stop(grace=0)


class Agent:
    def __init__(self, ledger_dir: Path, scratch: Path, keys_only: bool = False, entries_per_second: float = 0,
                 unary_catch_up: float = 0.2) -> None:
        self.proc = processes.spawn(
            [sys.executable, "-m", "bench.agent_index", "serve", str(ledger_dir), str(scratch), str(int(keys_only)),
             str(entries_per_second), str(unary_catch_up)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        port = int(self.proc.stdout.readline())  # type: ignore[union-attr]
        self.ps = psutil.Process(self.proc.pid)
        self.client = BookieClient(EndpointResolver({BOOKIE: f"127.0.0.1:{port}"}), deadline=600,
                                   ledgers_per_call=1000, max_calls_per_bookie=1)

    def cpu(self) -> float:
        t = self.ps.cpu_times()
        return t.user + t.system

    def listing(self, ids: list[int]) -> tuple[int, float, float]:
        """Every ledger answered: (entries listed, the agent's CPU seconds, wall seconds)."""
        cpu, t0 = self.cpu(), time.perf_counter()
        got = self.client.fetch(BOOKIE, ids)
        wall, spent = time.perf_counter() - t0, self.cpu() - cpu
        assert len(got) == len(ids) and all(a.availability is not None for a in got.values())
        return sum([a.availability.count for a in got.values() if a.availability is not None]), spent, wall

    def unary_cpu(self, calls: int) -> float:
        """The agent's CPU per one-ledger call for a ledger it does not hold."""
        with BookieClient(self.client.resolver, streaming=False, unary_in_flight=1) as unary:
            unary.fetch(BOOKIE, [1])
            cpu = self.cpu()
            unary.fetch(BOOKIE, range(1, calls + 1))
            return (self.cpu() - cpu) / calls

    def close(self) -> None:
        self.client.close()
        self.proc.stdin.close()  # type: ignore[union-attr]
        self.proc.wait(timeout=30)


def per_entry(agent: Agent, ids: list[int], keys: int) -> tuple[float, float]:
    """One warm listing by the agent: (its CPU us per entry, entries per second)."""
    n, cpu, wall = agent.listing(ids)
    assert n == keys
    return cpu / n * 1e6, n / wall


def run(sizes: list[int], ledgers: int, rounds: int) -> Iterator[dict[str, Any]]:
    """Per size: the floor and the agent measured in alternation, `rounds` times (this machine's speed
    drifts by a third between minutes: a ratio is taken within each round, then the median of them)."""
    for keys in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            t0 = time.perf_counter()
            index = LiveIndex(root / "bookie", keys, ledgers)
            ids = index.ids.tolist()
            row: dict[str, Any] = {"index keys": index.keys, "ledgers": ledgers, "SST files per level": index.files,
                                   "build s": time.perf_counter() - t0}
            try:
                floor = Floor(root / "bookie", ids, root)
                agent = Agent(root / "bookie", root / "scratch")
                keys_only = Agent(root / "bookie", root / "scratch-keys-only", keys_only=True)
                try:
                    agent.listing(ids)  # warm: the block cache, the channel
                    keys_only.listing(ids)
                    floors, agents, keys_onlys, rates = [], [], [], []
                    for _ in range(rounds):
                        listed, seconds = floor.listing()
                        assert listed == index.keys, (listed, index.keys)  # the memtable's keys are listed too
                        floors.append(seconds / listed * 1e6)
                        us, rate = per_entry(agent, ids, index.keys)
                        agents.append(us)
                        rates.append(rate)
                        keys_onlys.append(per_entry(keys_only, ids, index.keys)[0])
                    row["native floor us/entry"] = statistics.median(floors)
                    row["agent us/entry"] = statistics.median(agents)
                    row["agent / floor"] = statistics.median(a / f for a, f in zip(agents, floors, strict=True))
                    row["keys-only path us/entry"] = statistics.median(keys_onlys)
                    row["keys-only path / floor"] = statistics.median(e / f for e, f in zip(keys_onlys, floors,
                                                                                              strict=True))
                    row["agent / keys-only path"] = statistics.median(a / k for a, k in zip(agents, keys_onlys,
                                                                                              strict=True))
                    row["agent entries/s"] = statistics.median(rates)
                    row["agent RSS MB"] = agent.ps.memory_info().rss / 2**20
                    row["unary CPU us/call"] = agent.unary_cpu(2000) * 1e6
                finally:
                    agent.close()
                    keys_only.close()
                every = Agent(root / "bookie", root / "scratch-every", unary_catch_up=0)
                try:
                    row["unary CPU us/call, catch-up every call"] = every.unary_cpu(2000) * 1e6
                finally:
                    every.close()
                budget = round(row["agent entries/s"] / 3, -3)  # a third of what it does unbounded
                capped = Agent(root / "bookie", root / "scratch-budget", entries_per_second=budget)
                try:
                    capped.listing(ids)  # spends the budget's credit (at most 0.1 s of the rate)
                    t0 = time.perf_counter()  # one clock over three listings: the gaps between them count
                    n = sum(capped.listing(ids)[0] for _ in range(3))
                    wall = time.perf_counter() - t0
                    row["budget entries/s"] = budget
                    row["with budget: entries/s"] = n / wall
                    row["with budget: entries"], row["with budget: seconds"] = n, wall
                finally:
                    capped.close()
            finally:
                index.close()
            yield row


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        serve(sys.argv[2], sys.argv[3], sys.argv[4] == "1", float(sys.argv[5]), float(sys.argv[6]))
        return
    p = argparse.ArgumentParser()
    p.add_argument("--keys", default="2000000,10000000", help="index sizes, entries in all")
    p.add_argument("--ledgers", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5, help="floor and agent measured in alternation this often")
    a = p.parse_args()
    if not shutil.which("gcc") or not Path("/usr/include/rocksdb/c.h").exists():
        sys.exit("the native floor needs gcc and Debian's librocksdb-dev (make bench-deps)")
    rows = []
    for row in run([int(k) for k in a.keys.split(",")], a.ledgers, a.rounds):
        rows.append(row)
        print(table(rows), file=sys.stderr, flush=True)  # as it goes: a size takes minutes
    print(table(rows))


if __name__ == "__main__":
    main()
