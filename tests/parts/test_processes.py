"""The test tooling's, the benches' and the demo's children die with their parent, however it ends: a parent
killed with SIGKILL (no handler, no atexit) leaves neither its ZooKeeper nor its agents running. A test server
whose picked port another worker took first starts on another."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from scrutiny.testing import processes
from scrutiny.testing.localzk import LocalZooKeeper, LocalZooKeeperError, free_port, free_ports

PARENT = """
import sys, threading
from scrutiny.testing import processes
from scrutiny.testing.localzk import LocalZooKeeper
zk = LocalZooKeeper()
threading.Thread(target=zk.start).start()  # forked from a thread that ends at once: the child must outlive it
agent = processes.spawn([sys.executable, "-c", "import time; time.sleep(600)"])
while not zk.running:
    pass
print(zk.pid, agent.pid, flush=True)
sys.stdin.read()
"""


def test_children_die_with_a_parent_killed_hard() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        children = [psutil.Process(int(pid)) for pid in parent.stdout.readline().split()]  # type: ignore[union-attr]
        time.sleep(1)
        assert len(children) == 2 and all(c.is_running() for c in children)  # alive after the thread that forked
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        _, alive = psutil.wait_procs(children, timeout=15)
        assert alive == [], [c.cmdline()[:3] for c in alive]
    finally:
        processes.reap(parent)


def test_run_is_subprocess_run_with_a_bound() -> None:
    done = processes.run([sys.executable, "-c", "import sys; print(sys.stdin.read().upper())"], input="x",
                         capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout.strip()) == (0, "X")
    with pytest.raises(subprocess.TimeoutExpired):
        processes.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=0.5)


def test_a_test_server_whose_port_was_taken_meanwhile_starts_on_another() -> None:
    """Three workers pick free ports at once: one may bind the port another picked before its server does."""
    zk = LocalZooKeeper()
    picked = zk.port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", picked))
        squatter.listen()
        try:
            zk.start()
            assert zk.port != picked and zk.running
            moved = zk.port
            zk.restart()  # once it has served, its clients know the port: it keeps it
            assert zk.port == moved
        finally:
            zk.close()
    fixed = LocalZooKeeper(port=free_port())  # (not `moved`: the closed server's connections keep it a while)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", fixed.port))
        squatter.listen()
        with pytest.raises(LocalZooKeeperError, match="exited"):  # a port the caller chose: no other
            fixed.start(timeout=20)
    fixed.close()


def test_ports_picked_together_are_all_different(monkeypatch: pytest.MonkeyPatch) -> None:
    """An ensemble's quorum and election ports once came out the same (each pick is free only when made)."""
    from scrutiny.testing import localzk

    picks = iter([31538, 31538, 11636, 18954, 11636, 28110])
    monkeypatch.setattr(localzk, "free_port", lambda: next(picks))
    assert free_ports(3, besides={18954}) == [31538, 11636, 28110]
    monkeypatch.undo()
    assert len(set(free_ports(30, besides={free_port()}))) == 30  # the real picks
