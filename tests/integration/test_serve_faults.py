"""Faults against a real ``kbatch serve``: bursts, kill -9, a leaving member, broker restarts.

Each test produces requests with unique keys and checks, by reading the reply topic, that every
one was answered; figures worth reporting (duplicates, peak RSS, recovery time) are printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import shutil
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from consumer.broker.local import LocalBroker
from consumer.kafka.admin import create_topics
from tests.conftest import TopicFactory, unique_group
from tests.integration.harness import (
    KAFKA_CLIENT,
    ReplyRecord,
    Req,
    ServeProcess,
    committed_offsets,
    free_port_pair,
    kill,
    poll_until,
    produce,
    read_all,
    read_topic,
    request,
)


def all_keys(n: int, prefix: str = "r") -> set[bytes]:
    return {f"{prefix}-{i}".encode() for i in range(n)}


def covers(keys: set[bytes]) -> Callable[[list[ReplyRecord]], bool]:
    return lambda rs: keys <= {r.key for r in rs}


def duplicates(replies: list[ReplyRecord]) -> int:
    return len(replies) - len({r.key for r in replies})


def start(
    tmp_path: Path,
    bootstrap: str,
    topics: tuple[str, str, str],
    group: str,
    model: str,
    **kw: Any,
) -> ServeProcess:
    """A ``kbatch serve`` on ``topics`` = (requests, replies, dead letters)."""
    req, rep, dlq = topics
    return ServeProcess.start(
        tmp_path,
        bootstrap=bootstrap,
        request_topic=req,
        reply_topic=rep,
        dlq_topic=dlq,
        group_id=group,
        model=model,
        **kw,
    )


async def test_burst_pauses_partitions_and_bounds_memory(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    """A pre-filled burst against the real MiniLM on 2 cores: pauses show, memory stays flat."""
    req, rep, dlq = await new_topic("req", 2), await new_topic("rep"), await new_topic("dlq")
    n = 1_500
    texts = [f"burst request number {i} " + "with some words " * (i % 7) for i in range(n)]
    await produce(kafka_bootstrap, req, [request(f"r-{i}", t) for i, t in enumerate(texts)])
    limits = ["--max-partition-records", "64", "--max-total-records", "96"]
    server = start(
        tmp_path,
        kafka_bootstrap,
        (req, rep, dlq),
        unique_group("burst"),
        "minilm",
        extra=[*limits, "--poll-max-records", "64"],
    )
    try:
        server.wait_ready()
        baseline_rss = server.sample_rss()
        max_in_flight = 0.0

        def sample() -> bool:
            nonlocal max_in_flight
            server.sample_rss()
            m = server.metrics()
            max_in_flight = max(max_in_flight, m.get("kbatch_in_flight_records", 0.0))
            return m.get('kbatch_replies_total{status="ok"}', 0.0) >= n

        poll_until(sample, 300, "every burst request answered", every_s=0.2)
        metrics = server.metrics()
    finally:
        server.stop()
    replies = await read_topic(kafka_bootstrap, rep, covers(all_keys(n)), 60)
    assert {r.key for r in replies} == all_keys(n)
    assert metrics["kbatch_pauses_total"] >= 1
    # Taken in but unanswered never exceeds the total limit plus one poll chunk.
    assert max_in_flight <= 96 + 64
    growth_mib = (server.peak_rss_bytes - baseline_rss) / 2**20
    print(
        f"\nburst: RSS {baseline_rss / 2**20:.0f} MiB when ready, "
        f"peak {server.peak_rss_bytes / 2**20:.0f}"
        f" MiB (+{growth_mib:.0f}), max in flight {max_in_flight:.0f}"
    )
    assert growth_mib < 400


async def test_sigkill_then_restart_answers_everything(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory, tiny_embed_dir: Path
) -> None:
    req, rep, dlq = await new_topic("req", 2), await new_topic("rep"), await new_topic("dlq")
    group = unique_group("kill")
    n = 600
    await produce(
        kafka_bootstrap, req, [request(f"r-{i}", f"text {i} " * (1 + i % 20)) for i in range(n)]
    )
    server = start(tmp_path, kafka_bootstrap, (req, rep, dlq), group, str(tiny_embed_dir))
    try:
        server.wait_ready()
        poll_until(
            lambda: server.metrics().get('kbatch_replies_total{status="ok"}', 0) >= 100,
            120,
            "100 replies",
        )
        # A crash after some progress was committed: with a fast model the whole backlog can be
        # answered before the first commit, and then every reply repeats (allowed, not tested).
        commits = server.metrics().get("kbatch_commit_seconds_count", 0)
        poll_until(
            lambda: server.metrics().get("kbatch_commit_seconds_count", 0) > commits,
            30,
            "a commit after 100 replies",
            every_s=0.02,
        )
        kill(server)
        server.launch()
        server.wait_ready()
        replies = await read_topic(kafka_bootstrap, rep, covers(all_keys(n)), 180)
    finally:
        server.stop()
    dups = duplicates(replies)
    print(f"\nSIGKILL: {len(replies)} replies for {n} requests, {dups} duplicates")
    assert {r.key for r in replies} == all_keys(n)
    assert dups < n  # a repeat is allowed, a loss is not


async def test_two_members_one_leaves_midway(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory, tiny_embed_dir: Path
) -> None:
    req, rep, dlq = await new_topic("req", 4), await new_topic("rep"), await new_topic("dlq")
    group = unique_group("pair")
    n = 800
    first = start(tmp_path, kafka_bootstrap, (req, rep, dlq), group, str(tiny_embed_dir), name="a")
    second = start(tmp_path, kafka_bootstrap, (req, rep, dlq), group, str(tiny_embed_dir), name="b")
    try:
        first.wait_ready()
        second.wait_ready()
        producing = asyncio.create_task(
            produce(
                kafka_bootstrap,
                req,
                [request(f"r-{i}", f"text {i} " * (1 + i % 30)) for i in range(n)],
            )
        )
        await asyncio.to_thread(
            poll_until,
            lambda: second.metrics().get('kbatch_replies_total{status="ok"}', 0) >= 50,
            120,
            "b answers",
        )
        second.signal(signal.SIGTERM)
        assert await asyncio.to_thread(second.wait, 60) == 0
        await producing
        replies = await read_topic(kafka_bootstrap, rep, covers(all_keys(n)), 180)
    finally:
        first.stop()
        second.stop()
    assert {r.key for r in replies} == all_keys(n)
    print(f"\ntwo members: {duplicates(replies)} duplicates after a graceful leave")


@contextlib.asynccontextmanager
async def own_broker(prefix: str) -> AsyncIterator[tuple[LocalBroker, str]]:
    """A fresh broker of its own (the shared one stays up) with ``<prefix>.req`` (2
    partitions), ``.rep`` and ``.dlq``; stopped and its data removed at the end. Yields the
    broker and its bootstrap address."""
    broker = LocalBroker(port=free_port_pair())
    try:
        bootstrap = await asyncio.to_thread(broker.start, fresh=True)
        await create_topics(bootstrap, [f"{prefix}.req"], partitions=2)
        await create_topics(bootstrap, [f"{prefix}.rep", f"{prefix}.dlq"])
        yield broker, bootstrap
    finally:
        await asyncio.to_thread(broker.stop)
        shutil.rmtree(broker.home, ignore_errors=True)


async def test_broker_restart_mid_run(tmp_path: Path, tiny_embed_dir: Path) -> None:
    """A broker of its own (so the shared one stays up), stopped and restarted mid-run."""
    async with own_broker("b") as (broker, bootstrap):
        n = 400
        await produce(bootstrap, "b.req", [request(f"r-{i}", f"text {i}") for i in range(n // 2)])
        server = start(
            tmp_path, bootstrap, ("b.req", "b.rep", "b.dlq"), "restart-group", str(tiny_embed_dir)
        )
        try:
            server.wait_ready()
            poll_until(
                lambda: server.metrics().get('kbatch_replies_total{status="ok"}', 0) >= 50,
                120,
                "50 replies",
            )
            await asyncio.to_thread(broker.stop)
            down_since = time.monotonic()
            await asyncio.to_thread(broker.start)
            await produce(
                bootstrap, "b.req", [request(f"r-{i}", f"text {i}") for i in range(n // 2, n)]
            )
            replies = await read_topic(bootstrap, "b.rep", covers(all_keys(n)), 240)
            recovered_s = time.monotonic() - down_since
            assert server.proc is not None and server.proc.poll() is None, server.log_tail()
        finally:
            server.stop()
    assert {r.key for r in replies} == all_keys(n)
    print(
        f"\nbroker restart: all {n} answered {recovered_s:.1f}s after the stop, "
        f"{duplicates(replies)} duplicates"
    )


async def test_the_only_broker_down_for_17_s_is_warnings_not_a_flood_of_errors(
    tmp_path: Path,
) -> None:
    """A broker of its own (the shared one stays up), SIGKILLed for 17 s: aiokafka's retried
    ``Unable to update metadata from [1]`` was 192 ERROR lines (11 a second); now a WARNING a
    minute (consumer/kafka/log_levels.py), no ERROR of it under a minute's outage, nothing
    lost."""
    async with own_broker("o") as (broker, bootstrap):
        n = 40
        server = start(tmp_path, bootstrap, ("o.req", "o.rep", "o.dlq"), "outage", "sim:0,0")
        try:
            server.wait_ready()
            await produce(bootstrap, "o.req", [request(f"r-{i}", f"t {i}") for i in range(n // 2)])
            await read_topic(bootstrap, "o.rep", covers(all_keys(n // 2)), 60)
            await asyncio.to_thread(broker.kill)
            await asyncio.sleep(17.0)  # the outage's length, not a synchronisation
            await asyncio.to_thread(broker.start)
            later = [request(f"r-{i}", f"t {i}") for i in range(n // 2, n)]
            await produce(bootstrap, "o.req", later)
            replies = await read_topic(bootstrap, "o.rep", covers(all_keys(n)), 120)
            assert server.proc is not None and server.proc.poll() is None, server.log_tail()
        finally:
            server.stop()
    lines = server.log_path.read_text(errors="replace").splitlines()
    errors = [line for line in lines if " ERROR " in line]
    client_log = " WARNING aiokafka" if KAFKA_CLIENT == "aiokafka" else " WARNING "
    warnings = [line for line in lines if client_log in line]
    print(f"\nonly broker down 17 s: {len(errors)} ERROR, {len(warnings)} client WARNING lines")
    assert {r.key for r in replies} == all_keys(n)
    # One ERROR is allowed: the outage (with the restart, past --session-timeout-ms) ended this
    # member's session, which aiokafka reports once; it rejoins by itself.
    assert [e for e in errors if "Heartbeat session expired" not in e] == []
    down = "Unable to update metadata" if KAFKA_CLIENT == "aiokafka" else "brokers are down"
    assert any(down in line for line in warnings)
    assert len(warnings) <= 10  # a WARNING a minute per kind of line, not one per retry
    assert len(warnings) <= 20


async def test_sigterm_drains_commits_and_repeats_nothing(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory, tiny_embed_dir: Path
) -> None:
    req, rep, dlq = await new_topic("req", 2), await new_topic("rep"), await new_topic("dlq")
    group = unique_group("term")
    n = 600
    await produce(
        kafka_bootstrap, req, [request(f"r-{i}", f"text {i} " * (1 + i % 25)) for i in range(n)]
    )
    server = start(tmp_path, kafka_bootstrap, (req, rep, dlq), group, str(tiny_embed_dir))
    try:
        server.wait_ready()
        poll_until(
            lambda: server.metrics().get('kbatch_replies_total{status="ok"}', 0) >= 100,
            120,
            "100 replies",
        )
        server.signal(signal.SIGTERM)
        assert server.wait(60) == 0, server.log_tail()
        answered = await read_all(kafka_bootstrap, rep, 1)
        committed = await committed_offsets(kafka_bootstrap, group, req, 2)
        # Everything below the committed offsets was answered before the exit.
        assert sum(v or 0 for v in committed.values()) == len({r.key for r in answered})
        server.launch()
        server.wait_ready()
        replies = await read_topic(kafka_bootstrap, rep, covers(all_keys(n)), 180)
    finally:
        server.stop()
    assert {r.key for r in replies} == all_keys(n)
    assert duplicates(replies) == 0


def long_texts(n: int, words: int = 120) -> list[str]:
    """Texts of ~``words`` tokens: slow enough on MiniLM (one torch thread) to buffer work."""
    return [
        f"request {i} " + " ".join(f"w{(i * 7 + j) % 997}" for j in range(words)) for i in range(n)
    ]


async def test_sigterm_drain_stops_at_its_deadline_and_leaves_the_rest_uncommitted(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    # Regression: ``--drain-timeout-s 5`` with ~1,450 buffered exited 0 after 29.9 s, having
    # computed everything. Now: stop by the deadline (plus closing), exit 3, nothing lost.
    req, rep, dlq = await new_topic("req", 2), await new_topic("rep"), await new_topic("dlq")
    group = unique_group("drain")
    n, drain_s = 800, 3.0
    texts = long_texts(n)
    await produce(kafka_bootstrap, req, [request(f"r-{i}", t) for i, t in enumerate(texts)])
    server = start(
        tmp_path,
        kafka_bootstrap,
        (req, rep, dlq),
        group,
        "minilm",
        extra=["--drain-timeout-s", str(drain_s)],
    )
    try:
        server.wait_ready()
        poll_until(
            lambda: server.metrics().get('kbatch_replies_total{status="ok"}', 0) >= 20,
            120,
            "20 replies",
        )
        in_flight = server.metrics().get("kbatch_in_flight_records", 0.0)
        server.signal(signal.SIGTERM)
        signalled = time.monotonic()
        code = await asyncio.to_thread(server.wait, 120)
        exit_s = time.monotonic() - signalled
        answered = await read_all(kafka_bootstrap, rep, 1)
        committed = await committed_offsets(kafka_bootstrap, group, req, 2)
        server.launch()
        server.wait_ready()
        replies = await read_topic(kafka_bootstrap, rep, covers(all_keys(n)), 300)
    finally:
        server.stop()
    answered_keys = {r.key for r in answered}
    dups = duplicates(replies)
    print(
        f"\ndrain: {in_flight:.0f} in flight at SIGTERM, exit {code} after {exit_s:.1f} s "
        f"(--drain-timeout-s {drain_s}), {len(answered_keys)} answered before the exit, "
        f"committed {sum(v or 0 for v in committed.values())}, {dups} keys answered twice"
    )
    assert code == 3, server.log_tail()
    assert exit_s < drain_s + 3.0  # the deadline plus closing the clients
    assert sum(v or 0 for v in committed.values()) <= len(answered_keys) < n
    assert {r.key for r in replies} == all_keys(n)
    assert dups <= len(answered_keys) - sum(v or 0 for v in committed.values())


async def test_a_rebalance_under_load_finishes_its_revoke_in_time_and_repeats_nothing(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    # Regression: with ~30 s of work buffered and a second member joining, the revoke ran
    # 15–25 s (over --rebalance-timeout-ms 10000), the first member was dropped from the group
    # and the second recomputed from the last commit: 792 of 1,200 keys answered twice.
    req, rep, dlq = await new_topic("req", 4), await new_topic("rep"), await new_topic("dlq")
    group = unique_group("handover")
    n = 1_200
    await produce(kafka_bootstrap, req, [request(f"r-{i}", t) for i, t in enumerate(long_texts(n))])
    extra = ["--rebalance-timeout-ms", "10000", "--batch-timeout-s", "5"]
    first = start(tmp_path, kafka_bootstrap, (req, rep, dlq), group, "minilm", extra=extra)
    second = None
    try:
        first.wait_ready()
        poll_until(
            lambda: first.metrics().get('kbatch_replies_total{status="ok"}', 0) >= 50,
            120,
            "50 replies",
        )
        in_flight = first.metrics().get("kbatch_in_flight_records", 0.0)
        joined = time.monotonic()
        second = start(
            tmp_path, kafka_bootstrap, (req, rep, dlq), group, "minilm", name="b", extra=extra
        )
        # Ready = assigned: the rebalance, and so the first member's revoke, has ended.
        await asyncio.to_thread(second.wait_ready, 120)
        handover_s = time.monotonic() - joined
        first_assigned = first.metrics().get("kbatch_assigned_partitions", 0.0)
        replies = await read_topic(kafka_bootstrap, rep, covers(all_keys(n)), 600)
    finally:
        first.stop()
        if second is not None:
            second.stop()
    dups = duplicates(replies)
    log = first.log_path.read_text(errors="replace")
    revokes_s = [float(s) for s in re.findall(r"revoked \[.*\] in ([0-9.]+) s", log)]
    print(
        f"\nrebalance: {in_flight:.0f} in flight at the join, revoke took {revokes_s} s "
        f"(it commits at once and keeps its work), second member assigned after "
        f"{handover_s:.1f} s (its start-up included), first keeps {first_assigned:.0f} "
        f"partitions, {dups} keys answered twice"
    )
    assert {r.key for r in replies} == all_keys(n)
    # Regression: the revoke waits for no model work (it was up to 8 s, 80 % of the rebalance
    # timeout): at most 1 s for replies already sent, then the commit.
    assert revokes_s and max(revokes_s) <= 2.0
    assert first_assigned >= 1  # still in the group: the revoke ended within the timeout
    assert dups == 0


async def true_lag(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """Log end minus the group's committed offset (0 when none) per partition, from the broker."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    probe = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await probe.start()
    try:
        ends = await probe.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
    finally:
        await probe.stop()
    committed = await committed_offsets(bootstrap, group, topic, partitions)
    return {tp.partition: end - (committed[tp.partition] or 0) for tp, end in ends.items()}


async def test_lag_gauge_shows_the_whole_backlog_of_paused_and_uncommitted_partitions(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    # Regression: under a backlog of 11,677 records the gauge showed ~2,700: a partition
    # without a commit had no series, a paused partition's value froze while its log grew.
    req, rep, dlq = await new_topic("req", 3), await new_topic("rep"), await new_topic("dlq")
    group = unique_group("lag")

    def on(partition: int, start_i: int, n: int) -> list[Req]:
        reqs = [request(f"p{partition}-{i}", t) for i, t in enumerate(long_texts(n), start_i)]
        return [dataclasses.replace(r, partition=partition) for r in reqs]

    await produce(kafka_bootstrap, req, on(0, 0, 300) + on(1, 0, 300))
    limits = ["--max-partition-records", "16", "--max-total-records", "32"]
    server = start(tmp_path, kafka_bootstrap, (req, rep, dlq), group, "minilm", extra=limits)
    try:
        server.wait_ready()
        poll_until(lambda: server.metrics().get("kbatch_pauses_total", 0) >= 1, 60, "a pause")
        await produce(kafka_bootstrap, req, on(0, 300, 400))  # the paused log grows
        gauge: dict[int, float] = {}
        truth: dict[int, int] = {}
        deadline = time.monotonic() + 30
        while True:
            truth = await true_lag(kafka_bootstrap, group, req, 3)
            m = server.metrics()
            gauge = {
                p: m[key]
                for p in range(3)
                if (key := f'kbatch_consumer_lag{{partition="{p}",topic="{req}"}}') in m
            }
            # Within what the model answers between the two reads (a second or two).
            if len(gauge) == 3 and all(abs(gauge[p] - truth[p]) <= 30 for p in range(3)):
                break
            assert time.monotonic() < deadline, f"gauge {gauge} vs true lag {truth}"
            await asyncio.sleep(0.5)  # the next sample (not a synchronisation)
        paused = server.metrics().get("kbatch_paused_partitions", 0.0)
    finally:
        server.stop()
    print(f"\nlag: gauge {gauge} vs true lag {truth} ({paused:.0f} partitions paused)")
    assert sum(gauge.values()) >= 600  # the whole backlog shows, not the fetched part


async def test_a_wedged_engine_fails_healthz_leaves_the_group_and_exits_4(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    """A batch that outruns 3 × --batch-timeout-s (consumer/serve/wedge.py): /healthz turns 503,
    the static member leaves the group and the process exits 4 without waiting for the model
    thread; what it answered is committed, nothing past it, and the next owner answers the rest.

    The simulated device costs 100 ms a token, one request a batch: the short requests take
    ~0.6 s each, the long one ~20 s (the bound: 3 × 2 s)."""
    req, rep, dlq = await new_topic("req"), await new_topic("rep"), await new_topic("dlq")
    group = unique_group("wedge")
    n = 5
    await produce(kafka_bootstrap, req, [request(f"r-{i}", f"short {i}") for i in range(n)])
    extra = ["--batch-timeout-s", "2", "--max-batch-size", "1", "--group-instance-id", "wedged"]
    wedged = start(
        tmp_path, kafka_bootstrap, (req, rep, dlq), group, "sim:0,100000", name="w", extra=extra
    )
    try:
        wedged.wait_ready()
        await read_topic(kafka_bootstrap, rep, covers(all_keys(n)), 60)
        commits = wedged.metrics().get("kbatch_commit_seconds_count", 0)
        poll_until(
            lambda: wedged.metrics().get("kbatch_commit_seconds_count", 0) > commits,
            30,
            "a commit after the short requests' replies",
            every_s=0.05,
        )
        await produce(kafka_bootstrap, req, [request("long", " ".join(["word"] * 200))])
        healthz: list[tuple[int, bytes]] = []

        def unhealthy() -> bool:
            assert wedged.proc is not None and wedged.proc.poll() is None, wedged.log_tail()
            healthz.append(wedged._get("/healthz"))
            return healthz[-1][0] == 503

        poll_until(unhealthy, 60, "/healthz 503")
        failed_at = time.monotonic()
        code = await asyncio.to_thread(wedged.wait, 60)
        exit_s = time.monotonic() - failed_at
    finally:
        wedged.stop()
    assert code == 4, wedged.log_tail()
    assert exit_s < 10.0  # the drain of sent replies and the closes; not the model's ~14 s more
    assert b'"engine_wedged": true' in healthz[-1][1]
    log = wedged.log_path.read_text(errors="replace")
    assert "ERROR kbatch: engine wedged" in log
    assert "static member 'wedged' leaves the group on shutdown" in log
    answered = {r.key for r in await read_all(kafka_bootstrap, rep, 1)}
    committed = (await committed_offsets(kafka_bootstrap, group, req, 1))[0]
    assert answered == all_keys(n) and committed == n  # the long request's offset is not
    nxt = start(tmp_path, kafka_bootstrap, (req, rep, dlq), group, "sim:0,0", name="next")
    try:
        replies = await read_topic(kafka_bootstrap, rep, covers({b"long", *all_keys(n)}), 120)
    finally:
        nxt.stop()
    print(f"\nwedged engine: exit 4 {exit_s:.1f} s after /healthz failed, committed {committed}")
    assert duplicates(replies) == 0
