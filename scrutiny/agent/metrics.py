"""What an agent exports on /metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from scrutiny.metricnames import PREFIX


class AgentMetrics:
    """What an agent exports on /metrics: requests, answers by status, catch-up time."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(f"{PREFIX}agent_requests", "calls served", ["method"], registry=self.registry)
        self.answers = Counter(f"{PREFIX}agent_answers", "ledger answers by status", ["status"],
                               registry=self.registry)
        self.verified_bytes = Counter(f"{PREFIX}agent_deep_read_bytes", "entry-log bytes read by deep scrubs",
                                      registry=self.registry)
        self.corrupt = Counter(f"{PREFIX}agent_deep_corrupt_entries", "entries whose stored bytes failed, by reason",
                               ["reason"], registry=self.registry)
        self.catch_up = Histogram(f"{PREFIX}agent_catch_up_seconds", "catching up with the bookie, per request",
                                  registry=self.registry, buckets=(.0005, .001, .0025, .005, .01, .025, .05, .1, .5))
        self.entries = Counter(f"{PREFIX}agent_entries_listed", "entries (and ledgers) read from the index to answer",
                               registry=self.registry)
        self.throttled = Counter(f"{PREFIX}agent_throttled_seconds", "time answers waited for the CPU budget "
                                 "(entries_per_second)", registry=self.registry)
        self.changes = Counter(f"{PREFIX}agent_changes", "changes seen in what the bookie holds, by kind",
                               ["kind"], registry=self.registry)
        self.watch = Histogram(f"{PREFIX}agent_watch_seconds", "one look at the bookie for changes (catch-up "
                               "included)", registry=self.registry, buckets=(.001, .005, .01, .05, .1, .5, 1, 5))
        self.index_passes = Counter(f"{PREFIX}agent_index_passes", "every key of the `ledgers` index read to watch "
                                    "it (its write-ahead log could not tell what changed)", registry=self.registry)
        self.watching = Gauge(f"{PREFIX}agent_watching", "1 while the agent watches its ledgers index for changes "
                              "(a reader follows its feed, or left less than the linger ago)", registry=self.registry)
        self.budget = Gauge(f"{PREFIX}agent_entries_per_second_limit", "the CPU budget: entries listed per second, "
                            "all calls together (0: none)", registry=self.registry)

