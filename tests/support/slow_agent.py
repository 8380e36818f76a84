"""A real agent process whose source is slow (for kill-mid-stream and slow-agent tests).

usage: python tests/support/slow_agent.py SYNTHETIC_FILE DELAY_SECONDS_PER_LEDGER [STOP_GRACE_SECONDS]
Prints the port on its first line, then serves until signalled (as `scrutiny bookie-agent` does).
"""

from __future__ import annotations

import sys
import time

from scrutiny.agent import BookieAgent
from scrutiny.entrysources import Holding, SyntheticStore


class SlowSource:
    def __init__(self, inner: SyntheticStore, delay: float) -> None:
        self.inner, self.delay = inner, delay

    def refresh(self) -> None:
        pass

    def availability(self, ledger_id: int) -> Holding | None:
        time.sleep(self.delay)  # deaf to the agent's stop: a call deep in its source
        return self.inner.availability(ledger_id)

    def close(self) -> None:
        self.inner.close()


if __name__ == "__main__":
    agent = BookieAgent(SlowSource(SyntheticStore(sys.argv[1]), float(sys.argv[2])), bind="127.0.0.1:0",
                        answers_per_message=10).start()
    print(agent.port, flush=True)
    sys.exit(agent.serve_until_signalled(float(sys.argv[3]) if len(sys.argv) > 3 else 5.0))
