"""`scrutiny demo --real-bookkeeper`: the demo on real bookies of each BookKeeper line finds exactly the faults it
made (a whole share lost, an entry lost mid-share, a bit flipped on a disk)."""

from __future__ import annotations

import sys

from scrutiny.testing import processes
from scrutiny.testing.realbookkeeper import Release


def test_the_demo_on_real_bookies_finds_the_faults_it_made(release: Release) -> None:
    done = processes.run([sys.executable, "-m", "scrutiny.cli", "demo", "--real-bookkeeper", release.version,
                          "--no-serve"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "the findings equal the faults made" in done.stdout
    assert done.stdout.count(" yes  (") == 4
