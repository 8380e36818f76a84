"""The bookie agent: serves scrutiny.v1.Bookie next to one bookie, from one entry source.

- `servicer`: the answers (which entries each ledger has here, the ledgers held, stored entries verified);
- `watching`: whether the agent watches its bookie, who follows its change feed, the feed's streams;
- `limits`: the stop, the calls in flight and the rates that bound them;
- `metrics`: what it exports on /metrics;
- `server`: the gRPC server, its health, its registration and its life until a signal;
- `main`: `scrutiny bookie-agent`, the composition root.
"""

from __future__ import annotations

from scrutiny.agent.limits import AgentStopping, Rate
from scrutiny.agent.metrics import AgentMetrics
from scrutiny.agent.server import BookieAgent
from scrutiny.agent.servicer import MESSAGE_BYTES, BookieServicer, in_messages
from scrutiny.config import DEFAULT_AGENT_PORT

__all__ = ["DEFAULT_AGENT_PORT", "MESSAGE_BYTES", "AgentMetrics", "AgentStopping", "BookieAgent", "BookieServicer",
           "Rate", "in_messages"]
