"""The benchmarks keep working (tiny sizes; no speed is asserted here, only the agent budget's bound,
which a slow machine only loosens)."""

from __future__ import annotations

import pytest

from bench import (
    agent_index,
    agentcalls,
    agentwatch,
    checks,
    codec,
    deepscrub,
    driver_findings,
    ensemble_changes,
    feed_messages,
    messages,
    pipeline,
    repair,
    shapes,
    topics,
    zkreads,
    zkwatch,
)
from scrutiny.scan.engines import LocalEngine


def test_codec_bench_agrees_with_its_baseline() -> None:
    rows = codec.run([20_000], 1)
    assert [r["shape"] for r in rows] == ["healthy share", "random 90%"]
    assert rows[0]["groups"] == 2


def test_feed_messages_bench_reads_every_message_both_ways() -> None:
    rows = feed_messages.run(2, rate=20, seconds=1, rounds=1)  # fewer messages read than sent: it raises
    assert [r["us a message"] for r in rows] == ["as the leader follows (no probe)", "with gRPC's probe"]


def test_zookeeper_and_agent_benches_run() -> None:
    assert any("pipelined" in str(r["what"]) for r in zkreads.run(300))
    rows = agentcalls.run(300)
    assert [r["ledgers"] for r in rows] == [300, 300, 300]
    rows = zkwatch.run(200, slow_rate=20, slow_seconds=1, rounds=1)  # every notification arrived, or it waits 30 s
    assert [str(r["what"]).startswith("a notification") for r in rows] == [False, True, True]


def test_repair_bench_runs_each_loss_to_its_end() -> None:
    rows = {(r["percentage"], r["loss"]): r for r in repair.run(2_000, 2)}
    assert rows[(0, repair.MIDDLE)]["named"] == 2 and rows[(0, repair.MIDDLE)]["marked"] == 0
    assert all(rows[k]["repaired"] == 2 for k in ((0, repair.WHOLE), (100, repair.WHOLE), (100, repair.MIDDLE)))


def test_topics_bench_runs() -> None:
    row = topics.run(100, 5, rounds=1, engine=LocalEngine())  # every run complete and clean, every topic read
    assert row["ledgers"] == 500 and row["topics phase s"] > 0


def test_agent_watch_bench_runs() -> None:
    rows = agentwatch.run(2_000, per_second=20, seconds=0.5, rounds=1, settle=0.5)
    assert [r["agent"] for r in rows] == list(agentwatch.MODES)


def test_checks_bench_runs_and_agrees_with_its_baseline() -> None:
    rows = checks.run([1_000, 20_000], baseline_max=1_000)
    assert [r["entries"] for r in rows] == [1_000, 20_000, 1_000, 20_000]
    assert "entry-by-entry s" in rows[0]


def test_deep_scrub_bench_runs() -> None:
    rows = deepscrub.run(4, 20, repeats=1)
    assert [r["what"].split(":")[0] for r in rows][:2] == ["floor", "floor"] and len(rows) == 5


def test_messages_bench_compares_the_pulsar_parse_with_the_plain_scrub() -> None:
    rows = messages.run(2, 30, repeats=2)  # it asserts every entry's envelope came back, and only when asked
    assert [r["how"].split(" (")[0] for r in rows] == ["verify", "verify and frame the Pulsar entry",
                                                        "the caller"]
    assert rows[1]["entries"] == 60 and rows[1]["pair ratios"]
    rows = messages.validation(3, 50, repeats=1)  # it asserts the ledger alone ends where the whole topic does
    assert len(rows) == 5 and rows[2]["checkpoint bytes"] > 0


def test_pipeline_bench_runs_every_way() -> None:
    rows = pipeline.run(300, repeats=1)  # it asserts each way finds the range healthy
    assert [r["us per ledger"] > 0 for r in pipeline.metadata_floor(300, repeats=1)] == [True, True]
    assert [r["how"].split(",")[0] for r in rows] == ["answers decoded", "answers kept encoded", "the same", "the same",
                                                     "the plain ledgers in columns (as a first pass reads them)"]


def test_ensemble_changes_bench_runs() -> None:
    rows = ensemble_changes.run(400, repeats=1)  # it asserts every ledger healthy, answered as a real agent answers
    assert [r["ledgers"] for r in rows] == ["every one", "those whose ensemble changed"] and rows[1]["count"]


def test_shapes_bench_runs() -> None:
    (row,) = shapes.run([5], 400, repeats=1)  # it asserts every ledger checked and healthy, grouped and alone
    assert row["bookies"] == 25 and row["shapes in the range"]


def test_agent_index_bench_runs_against_its_native_floor() -> None:
    (row,) = agent_index.run([100_000], 100, 1)  # builds the C floor against Debian's librocksdb (make setup)
    assert row["index keys"] == 100_000 and row["native floor us/entry"] > 0 and row["agent us/entry"] > 0
    # what the limit promises over any stretch of time: the rate, and at most 0.1 s of it as credit (a
    # loaded machine refills it between calls); an unbounded agent lists three times the budget
    budget, n, wall = row["budget entries/s"], row["with budget: entries"], row["with budget: seconds"]
    assert n <= budget * (wall + 0.1) * 1.05, row


def test_driver_findings_bench_runs(spark_engine: object) -> None:
    row = driver_findings.run_size(300, spark_engine.session)  # type: ignore[attr-defined]
    assert row["findings"] == 300 and row["baseline: findings as objects MB"] >= 0


@pytest.mark.soak  # a minute: the bench on a small cluster, every loss class
def test_continuous_bench_runs() -> None:
    """Two auditor processes, the churn, every loss class (a few of each), a full-share bookie wiped."""
    from bench import continuous

    out = continuous.run(300, 2, 3, idle_s=2, churn_s=3, shares=[60.0])  # 5 changes a second
    assert [(r["injected"], r["found"]) for r in out["detect"]] == [(2, 2)] * 5 + [(1, 1)]
    rows = continuous.cost_rows(out, [60.0])
    assert rows[0]["cost"] == "zk_requests" and rows[0]["full run"] > 0
    assert out["missed"] == ["scrutiny_continuous_missed_total 0.0"]


@pytest.mark.soak  # half a minute: one auditor process, a few seconds of churn
def test_continuous_threads_bench_names_the_auditors_threads() -> None:
    from bench import continuous_threads

    out = continuous_threads.measure(300, idle_s=2, churn_s=5, rate=5.0)
    rows, threads = out["rows"], out["threads"]
    assert isinstance(rows, list) and isinstance(threads, list) and isinstance(out["changes"], int)
    assert out["changes"] >= 20 and rows[-1]["thread"] == "the process"
    assert {"continuous", "continuous-feeds", "election"} <= set(threads)  # named by the auditor itself
