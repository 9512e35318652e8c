"""``kbatch serve --replicas 2`` against the real broker: one group of two processes on one host.

The model is the simulated device (``sim:``: MiniLM's tokenizer, a sleep per batch), so a run
takes seconds and a SIGKILL lands while requests are in flight.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from consumer.cpu.budget import read_cpu_budget
from consumer.lifecycle import process_running
from consumer.serve.replicas import RUNTIME_PREFIX
from tests.conftest import TopicFactory, unique_group
from tests.integration.harness import (
    ServeProcess,
    committed_offsets,
    kill,
    poll_until,
    produce,
    read_all,
    read_topic,
    request,
)
from tests.integration.test_serve_faults import all_keys, covers, duplicates

SIM = "sim:20,20,16"
"""20 ms + 20 µs per padded token: ~30 ms for a batch of 32 short texts."""

PARTITIONS = 4


SLOW_SIM = "sim:50,100,16"
"""~100 ms for a batch of 64 short texts: a drain finds work in flight."""

SMALL_INTAKE = ["--max-total-records", "128", "--max-partition-records", "64"]
"""Flow limits that keep most of a burst in Kafka (not taken in) when SIGTERM comes."""


def start_replicas(
    tmp_path: Path,
    bootstrap: str,
    topics: tuple[str, str, str],
    group: str,
    *extra: str,
    model: str = SIM,
) -> ServeProcess:
    req, rep, dlq = topics
    return ServeProcess.start(
        tmp_path,
        bootstrap=bootstrap,
        request_topic=req,
        reply_topic=rep,
        dlq_topic=dlq,
        group_id=group,
        model=model,
        name="replicas",
        extra=["--replicas", "2", *extra],
    )


def replies_ok(server: ServeProcess) -> float:
    return server.metrics().get('kbatch_replies_total{status="ok"}', 0.0)


async def burst(bootstrap: str, topic: str, n: int) -> None:
    await produce(
        bootstrap, topic, [request(f"r-{i}", f"text {i} " * (1 + i % 12)) for i in range(n)]
    )


async def test_two_replicas_answer_a_burst_and_host_metrics_match_the_topic(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    req, rep, dlq = (
        await new_topic("req", PARTITIONS),
        await new_topic("rep"),
        await new_topic("dlq"),
    )
    n = 2_000
    server = start_replicas(tmp_path, kafka_bootstrap, (req, rep, dlq), unique_group("rep2"))
    try:
        server.wait_ready()
        rows = server.readyz()["replicas"]
        assert [r["assigned_partitions"] for r in rows] == [2, 2], rows
        await burst(kafka_bootstrap, req, n)
        poll_until(lambda: replies_ok(server) >= n, 180, f"{n} ok replies")
        replies = await read_all(kafka_bootstrap, rep, 1)
        pids = {row["pid"] for row in server.readyz()["replicas"]}

        def busy_per_replica() -> bool:  # written on a beat, at most once a second
            m = server.metrics()
            return all(m.get(f'kbatch_model_busy_ratio{{pid="{pid}"}}', 0.0) > 0 for pid in pids)

        poll_until(busy_per_replica, 30, "a model busy ratio per replica process")
        metrics = server.metrics()
    finally:
        server.stop()
    assert server.wait() == 0, server.log_tail()
    assert {r.key for r in replies} == all_keys(n)
    # one /metrics for the host: the two replicas' counters summed
    assert metrics['kbatch_replies_total{status="ok"}'] == len(replies)
    assert metrics[f'kbatch_records_consumed_total{{topic="{req}"}}'] == n
    assert metrics["kbatch_assigned_partitions"] == PARTITIONS
    assert metrics['kbatch_replica_up{replica="0"}'] == 1
    assert metrics['kbatch_replica_up{replica="1"}'] == 1
    # each replica sized its pools from half the host's CPU budget; the host shows the sum
    assert metrics["kbatch_cpu_budget_cores"] == pytest.approx(read_cpu_budget().cores, abs=0.01)
    assert metrics['kbatch_threads{pool="torch"}'] == 2  # --torch-threads 1, per replica


async def test_sigterm_drains_both_replicas_exits_0_and_repeats_nothing_on_restart(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    req, rep, dlq = (
        await new_topic("req", PARTITIONS),
        await new_topic("rep"),
        await new_topic("dlq"),
    )
    group = unique_group("rep-term")
    n = 2_000
    topics = (req, rep, dlq)
    server = start_replicas(tmp_path, kafka_bootstrap, topics, group, *SMALL_INTAKE, model=SLOW_SIM)
    try:
        server.wait_ready()
        await burst(kafka_bootstrap, req, n)
        poll_until(lambda: replies_ok(server) >= 200, 120, "200 replies")
        server.signal(signal.SIGTERM)
        assert server.wait(90) == 0, server.log_tail()
        first = await read_all(kafka_bootstrap, rep, 1)
        committed = await committed_offsets(kafka_bootstrap, group, req, PARTITIONS)
        # both drained: everything below the committed offsets was answered, nothing beyond
        assert sum(v or 0 for v in committed.values()) == len({r.key for r in first})
        assert len(first) < n, "the burst finished before SIGTERM: nothing was drained"
        server.launch()
        server.wait_ready()
        replies = await read_topic(kafka_bootstrap, rep, covers(all_keys(n)), 180)
    finally:
        server.stop()
    assert {r.key for r in replies} == all_keys(n)
    assert duplicates(replies) == 0


async def test_sigkill_of_one_replica_loses_nothing(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    req, rep, dlq = (
        await new_topic("req", PARTITIONS),
        await new_topic("rep"),
        await new_topic("dlq"),
    )
    n = 2_000
    server = start_replicas(
        tmp_path,
        kafka_bootstrap,
        (req, rep, dlq),
        unique_group("rep-kill"),
        "--group-instance-id",
        f"host-{os.getpid()}",
    )
    try:
        server.wait_ready()
        victim = server.readyz()["replicas"][0]["pid"]
        await burst(kafka_bootstrap, req, n)
        poll_until(lambda: replies_ok(server) >= 200, 120, "200 replies")
        os.kill(victim, signal.SIGKILL)

        def restarted() -> bool:
            row = server.readyz()["replicas"][0]
            return row["restarts"] == 1 and row["ready"] and row["pid"] not in (None, victim)

        poll_until(restarted, 120, "replica 0 restarted and ready")
        replies = await read_topic(kafka_bootstrap, rep, covers(all_keys(n)), 180)
        metrics = server.metrics()
        server.signal(signal.SIGTERM)
        assert server.wait(90) == 0, server.log_tail()
    finally:
        server.stop()
    print(f"\nSIGKILL of a replica: {len(replies)} replies for {n}, {duplicates(replies)} repeats")
    assert {r.key for r in replies} == all_keys(n)
    assert metrics['kbatch_replica_restarts_total{replica="0"}'] == 1
    assert f"replica 0 (pid {victim}) exited unexpectedly" in server.log_path.read_text()


async def test_a_replica_killed_and_restarted_takes_its_partitions_back_without_a_rebalance(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    """No --group-instance-id: before, the replicas were dynamic members, and a kill -9's
    partitions waited out the session timeout while the restarted replica's join rebalanced
    the other. Now each replica has a static id from the host name and the group: the
    restarted one gets its own partitions back at once, and the other is never revoked."""
    req, rep, dlq = (
        await new_topic("req", PARTITIONS),
        await new_topic("rep"),
        await new_topic("dlq"),
    )
    session_s = 60
    server = start_replicas(
        tmp_path, kafka_bootstrap, (req, rep, dlq), unique_group("rep-static"),
        "--session-timeout-ms", str(session_s * 1000),
    )  # fmt: skip

    def rows() -> list[dict[str, Any]]:
        return list(server.readyz().get("replicas", []))

    def survivor_revokes() -> int:  # replica 1's revocations of partitions it held
        log = server.log_path.read_text(errors="replace").splitlines()
        return sum("[replica 1]" in x and "consumer.serve.rebalance: revoked [" in x for x in log)

    try:
        poll_until(
            lambda: [r["assigned_partitions"] for r in rows()] == [2, 2], 120, "2 partitions each"
        )
        before = survivor_revokes()
        victim = rows()[0]["pid"]
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()

        def back() -> bool:
            row = rows()[0]
            return row["pid"] not in (None, victim) and row["assigned_partitions"] == 2

        poll_until(back, session_s, "replica 0 back with its 2 partitions")
        back_s = time.monotonic() - killed_at
        after, survivor = survivor_revokes(), rows()[1]["assigned_partitions"]
        server.signal(signal.SIGTERM)
        assert server.wait(90) == 0, server.log_tail()
    finally:
        server.stop()
    print(f"\nkill -9 of a replica: its partitions back after {back_s:.1f} s")
    assert after == before  # no rebalance: the other replica never gave up its partitions
    assert survivor == 2
    assert back_s < session_s
    log = server.log_path.read_text(errors="replace")
    assert "static ids" in log and "leaves the group on shutdown" in log


def test_replicas_without_a_broker_exit_1(tmp_path: Path) -> None:
    import subprocess

    from tests.integration.harness import KBATCH

    proc = subprocess.run(
        [KBATCH, "serve", "--replicas", "2", "--bootstrap", "127.0.0.1:1", "--metrics-port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "no Kafka broker answered" in proc.stderr


async def test_more_replicas_than_partitions_is_warned(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    req, rep, dlq = await new_topic("req", 1), await new_topic("rep"), await new_topic("dlq")
    server = start_replicas(tmp_path, kafka_bootstrap, (req, rep, dlq), unique_group("rep-warn"))
    try:
        poll_until(
            lambda: "exceeds the 1 partitions" in server.log_path.read_text(),
            60,
            "the partition warning",
        )

        def one_assigned() -> bool:
            rows = server.readyz().get("replicas", [])
            return sorted(r["assigned_partitions"] or 0 for r in rows) == [0, 1]

        poll_until(one_assigned, 120, "one replica with the partition, one idle")
        assert server.readyz()["ready"] is False  # the idle member is not ready
        server.signal(signal.SIGTERM)
        assert server.wait(90) == 0, server.log_tail()
    finally:
        server.stop()


async def test_replicas_of_a_killed_supervisor_drain_and_exit(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    """kill -9 of the supervisor forwards no SIGTERM: its replicas notice (their parent changed),
    drain and exit instead of running on as orphan members; a new supervisor answers the rest."""
    req, rep, dlq = (
        await new_topic("req", PARTITIONS),
        await new_topic("rep"),
        await new_topic("dlq"),
    )
    n, group = 1_000, unique_group("rep-orphans")
    server = start_replicas(tmp_path, kafka_bootstrap, (req, rep, dlq), group)
    second = None
    pids: list[int] = []
    try:
        server.wait_ready()
        pids = [row["pid"] for row in server.readyz()["replicas"]]
        runtime = list(Path(tempfile.gettempdir()).glob(f"{RUNTIME_PREFIX}{server.pid}-*"))
        assert len(runtime) == 1, runtime  # the killed supervisor's settings and metrics
        await burst(kafka_bootstrap, req, n)
        poll_until(lambda: replies_ok(server) >= 100, 120, "100 replies")
        kill(server)
        poll_until(
            lambda: not any(process_running(p) for p in pids), 60, "the orphaned replicas exit"
        )
        (tmp_path / "second").mkdir()
        second = start_replicas(tmp_path / "second", kafka_bootstrap, (req, rep, dlq), group)
        replies = await read_topic(kafka_bootstrap, rep, covers(all_keys(n)), 180)
        second.wait_ready()  # it sweeps before it starts its replicas
        assert not runtime[0].exists()  # nothing the killed supervisor wrote is left behind
    finally:
        for pid in pids:  # never leave orphans behind when the test fails
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        server.stop()
        if second is not None:
            second.stop()
    assert {r.key for r in replies} == all_keys(n)
