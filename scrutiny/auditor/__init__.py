"""The background auditor (`scrutiny auditor`): two or three instances, exactly one active.

`daemon` composes the parts, each in its own module and testable alone:
- `main`: the process (settings, signals);
- `leadership`: the connection to the metadata store, scrutiny's own election (never BookKeeper's
  auditorelection), and the cadence of the periodic runs;
- `runkinds`: the kinds of run and what each looks at; `runqueue`: runs one at a time on one worker, a run
  still going when the next is due skipped and counted, BP-34's delayed re-check a one-off job;
- `publishing`: where a finished run goes (the sinks, the current state, what the next leader inherits);
  `sinks`: report files and StatsD; `collector`: what /metrics exports; `lastrun`, `history`, `deeprecord`:
  what the leaders keep in the store;
- `continuous` (with `backlog`, `feeds`, `currentstate`): continuous scrutiny on the leader;
- `trigger`: whether a run asked for starts (a periodic kind due, continuous scrutiny's full run);
- `service`: the Auditor RPC. The console it serves has a room of its own, `scrutiny.console`, which reads
  the auditor through `face` alone; `main` wires the two.
"""

from __future__ import annotations

from scrutiny.auditor.daemon import Auditor, AuditorConfig
from scrutiny.auditor.runkinds import DEEP, FULL, RESCAN, UNDERREPLICATION, WHATIF
from scrutiny.config import DEFAULT_AUDITOR_PORT, AuditorSettings

__all__ = ["DEEP", "DEFAULT_AUDITOR_PORT", "FULL", "RESCAN", "UNDERREPLICATION", "WHATIF", "Auditor", "AuditorConfig",
           "AuditorSettings"]
