"""A bookie agent stops within its grace after SIGTERM whatever its calls are doing (mid-stream,
throttled or not, catching up, under load), and at once at a second signal."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from bench.deepscrub import build
from scrutiny.entrysources.synthetic import SyntheticStoreWriter
from scrutiny.testing.processes import reap, stop
from scrutiny.v1 import bookie_pb2, bookie_pb2_grpc
from tests.support.helpers import slow_agent

pytestmark = pytest.mark.slow
GRACE = 2.0
LEDGERS = 40


@pytest.fixture(scope="module")
def bookie(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("stop") / "bookie"
    build(path, ledgers=LEDGERS, entries=200, payload=1024)
    return path


def start(bookie: Path, tmp: Path, *flags: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, "-m", "scrutiny.cli", "bookie-agent", "--bookie-id", "127.0.6.1:3181",
                             "--source", "dbledgerstorage", "--ledger-dir", str(bookie), "--scratch-dir", str(tmp),
                             "--bind", "127.0.0.1:0", "--stop-grace-seconds", str(GRACE), *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()  # type: ignore[union-attr]
    if "port" not in line:
        reap(proc)
        raise AssertionError(f"the agent did not start: {line!r} {proc.stderr.read()}")  # type: ignore[union-attr]
    return proc, int(line.split("port ")[1].split()[0])


@pytest.fixture
def load() -> Iterator[list[threading.Thread]]:
    threads: list[threading.Thread] = []
    yield threads
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "a client did not notice its agent had gone"


def loop_calls(port: int, threads: list[threading.Thread], clients: int = 3, verify: bool = True) -> None:
    """Clients that loop deep-verify streams and listings until their agent has gone."""

    def client(k: int) -> None:
        with grpc.insecure_channel(f"127.0.0.1:{port}", [("grpc.max_receive_message_length", 64 << 20)]) as ch:
            stub = bookie_pb2_grpc.BookieStub(ch)
            asks = bookie_pb2.VerifyEntriesOfLedgersRequest(ledgers=[
                bookie_pb2.LedgerToVerify(ledger_id=lid, digest_type=bookie_pb2.CRC32C) for lid in range(LEDGERS)])
            entries = bookie_pb2.GetListOfEntriesOfLedgersRequest(ledger_ids=list(range(LEDGERS)))
            while True:
                try:
                    for _ in (stub.VerifyEntriesOfLedgers(asks, timeout=30) if verify and k % 3 else
                              stub.GetListOfEntriesOfLedgers(entries, timeout=30)):
                        pass
                except grpc.RpcError as exc:
                    if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                        return
                    raise

    for k in range(clients):
        t = threading.Thread(target=client, args=(k,), daemon=True)
        t.start()
        threads.append(t)


@pytest.mark.parametrize("throttle", ["unlimited", "throttled"])
def test_an_agent_under_load_stops_within_its_grace(bookie: Path, tmp_path: Path, throttle: str,
                                                     load: list[threading.Thread]) -> None:
    """Rounds of: an agent, three clients looping deep-verify streams, SIGTERM at a random moment."""
    flags = ["--deep-bytes-per-second", "2000000"] if throttle == "throttled" else []
    rng = random.Random(7)
    for round_ in range(4):
        proc, port = start(bookie, tmp_path / f"scratch{round_}", *flags)
        loop_calls(port, load)
        time.sleep(rng.uniform(0.2, 1.5))
        took = stop(proc, grace=GRACE + 6)
        assert took is not None, f"round {round_}: the agent ({throttle}) did not exit within {GRACE + 6} s"
        assert took < GRACE + 2, f"round {round_}: {took:.1f} s to exit"
        assert proc.returncode == 0, proc.stderr.read()  # type: ignore[union-attr]
        for t in load:
            t.join(timeout=30)
        load.clear()


@pytest.fixture
def slow_store(tmp_path: Path) -> Path:
    w = SyntheticStoreWriter()
    for lid in range(100):
        w.add_entries("b1:3181", lid, range(10))
    return w.write_all(tmp_path)["b1:3181"]


def test_a_call_deep_in_its_source_does_not_hold_the_stop(slow_store: Path, load: list[threading.Thread]) -> None:
    proc, port = slow_agent(slow_store, delay=30, stop_grace=GRACE)  # each answer 30 s, deaf to the stop
    try:
        loop_calls(port, load, clients=2, verify=False)
        time.sleep(0.5)
        took = stop(proc, grace=GRACE + 6)
        assert took is not None and took < GRACE + 2
        assert proc.returncode == 0
    finally:
        reap(proc)


def test_a_second_signal_ends_the_agent_at_once(slow_store: Path, load: list[threading.Thread]) -> None:
    proc, port = slow_agent(slow_store, delay=30, stop_grace=60)  # the first stop would take a minute
    try:
        loop_calls(port, load, clients=2, verify=False)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert proc.poll() is None  # still in its grace
        took = stop(proc, grace=3, sig=signal.SIGINT)
        assert took is not None and took < 2
        assert proc.returncode == 128 + signal.SIGINT
    finally:
        reap(proc)
