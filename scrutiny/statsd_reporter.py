"""StatsD: what a run found, under the contract's names and BookKeeper's auditor gauge names."""

from __future__ import annotations

import logging

import statsd

from scrutiny.checks import Category
from scrutiny.report import Report

log = logging.getLogger(__name__)

# scrutiny category -> upstream auditor gauge (scope `auditor`), for operators' existing dashboards.
BOOKKEEPER_GAUGES = {
    Category.PLACEMENT_POLICY_NOT_ADHERING: "NUM_LEDGERS_NOT_ADHERING_TO_PLACEMENT_POLICY",
    Category.PLACEMENT_POLICY_SOFTLY_ADHERING: "NUM_LEDGERS_SOFTLY_ADHERING_TO_PLACEMENT_POLICY",
    Category.UNDERREPLICATED_ELAPSED_GRACE_PERIOD: "NUM_UNDERREPLICATED_LEDGERS_ELAPSED_RECOVERY_GRACE_PERIOD",
    Category.NO_REPLICA_OF_AN_ENTRY: "NUM_LEDGERS_HAVING_NO_REPLICA_OF_AN_ENTRY",
    Category.LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY: "NUM_LEDGERS_HAVING_LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY",
    Category.LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY: "NUM_LEDGERS_HAVING_LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY",
}
PHASES = ("first_pass_ms", "recheck_ms", "verify_ms")


class StatsdReporter:
    def __init__(self, host: str, port: int = 8125, prefix: str = "scrutiny") -> None:
        self.client = statsd.StatsClient(host, port, prefix=prefix)

    def publish(self, report: Report, kind: str, duration_ms: int,
                categories: tuple[Category, ...] | None = None) -> None:
        """At the end of a run: counters per category, gauges under BookKeeper's names, timers,
        ledgers checked, failed bookie calls. `categories`: those the run looked at (all by default)."""
        counts = report.counts
        wanted = categories or tuple(Category)
        # A pipeline packs several metrics per datagram: fewer packets to drop under load.
        with self.client.pipeline() as pipe:
            for cat in wanted:
                pipe.incr(f"violations.{cat}", counts[str(cat)])
                if cat in BOOKKEEPER_GAUGES:
                    pipe.gauge(f"auditor.{BOOKKEEPER_GAUGES[cat]}", counts[str(cat)])
            pipe.timing(f"run.{kind}.duration", duration_ms)
            for phase in PHASES:
                if phase in report.stats:
                    pipe.timing(f"run.{kind}.{phase.removesuffix('_ms')}", report.stats[phase])
            pipe.incr("ledgers.checked", report.ledgers.get("checked", 0))
            pipe.incr("bookie_calls.failed", report.stats.get("bookie_calls_failed", 0))
            pipe.incr(f"runs.{kind}.{'complete' if report.complete else 'incomplete'}")

    def skipped(self, kind: str, reason: str) -> None:
        self.client.incr(f"runs.{kind}.skipped.{reason}")
