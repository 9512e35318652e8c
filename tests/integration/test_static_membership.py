"""Static membership (KIP-345, ``--group-instance-id``) against the real broker.

Kafka's consumer_test.py holds a static member's restart within the session timeout to no
revocation for anyone, and a second member under the same id to fencing one of the two.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.conftest import TopicFactory, unique_group
from tests.integration.harness import ServeProcess, kill, poll_until, produce, read_topic, request

SESSION_TIMEOUT_MS = 45_000  # longer than a restart of serve with the tiny model on two cores


def start(
    tmp_path: Path, bootstrap: str, topics: tuple[str, str, str], group: str, model: Path,
    name: str, instance: str, extra: tuple[str, ...] = (),
) -> ServeProcess:  # fmt: skip
    req, rep, dlq = topics
    return ServeProcess.start(
        tmp_path,
        bootstrap=bootstrap,
        request_topic=req,
        reply_topic=rep,
        dlq_topic=dlq,
        group_id=group,
        model=str(model),
        name=name,
        extra=[
            "--group-instance-id", instance,
            "--session-timeout-ms", str(SESSION_TIMEOUT_MS),
            "--heartbeat-interval-ms", "1000",
            *extra,
        ],
    )  # fmt: skip


def revoked(server: ServeProcess) -> float:
    return server.metrics().get('kbatch_rebalances_total{kind="revoked"}', 0.0)


async def test_a_static_member_restarted_within_the_session_timeout_rebalances_nobody(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory, tiny_embed_dir: Path
) -> None:
    topics = (await new_topic("req", 4), await new_topic("rep"), await new_topic("dlq"))
    group = unique_group("static")
    a = start(tmp_path, kafka_bootstrap, topics, group, tiny_embed_dir, "a", "pod-a")
    b = start(tmp_path, kafka_bootstrap, topics, group, tiny_embed_dir, "b", "pod-b")
    try:
        await asyncio.to_thread(a.wait_ready)
        await asyncio.to_thread(b.wait_ready)
        poll_until(
            lambda: (
                a.metrics().get("kbatch_assigned_partitions", 0) == 2
                and b.metrics().get("kbatch_assigned_partitions", 0) == 2
            ),
            60,
            "two partitions each",
        )
        a_revoked = revoked(a)
        kill(b)  # no LeaveGroup: a static member's absence waits for the session timeout
        b.launch()
        await asyncio.to_thread(b.wait_ready)
        n = 200
        await produce(kafka_bootstrap, topics[0], [request(f"s-{i}", f"t {i}") for i in range(n)])
        keys = {f"s-{i}".encode() for i in range(n)}
        replies = await read_topic(
            kafka_bootstrap, topics[1], lambda rs: keys <= {r.key for r in rs}, 120
        )
        a_after, b_assigned = revoked(a), b.readyz().get("assigned_partitions")
        a_answered = a.metrics().get('kbatch_replies_total{status="ok"}', 0)
    finally:
        a.stop()
        b.stop()
    print(f"\nstatic restart: a revoked {a_after - a_revoked:.0f} times, b back with {b_assigned}")
    assert a_after == a_revoked  # the other member never noticed
    assert b_assigned == 2  # the restarted member got its own partitions back
    assert a_answered > 0 and {r.key for r in replies} >= keys


async def test_a_static_member_stopped_for_good_leaves_and_its_partitions_move_at_once(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory, tiny_embed_dir: Path
) -> None:
    # Regression: a static member's scale-down left its partitions without an owner for the
    # whole session timeout (aiokafka sends no LeaveGroup for a static member).
    topics = (await new_topic("req", 4), await new_topic("rep"), await new_topic("dlq"))
    group = unique_group("static-leave")
    a = start(tmp_path, kafka_bootstrap, topics, group, tiny_embed_dir, "a", "pod-a")
    b = start(
        tmp_path, kafka_bootstrap, topics, group, tiny_embed_dir, "b", "pod-b",
        extra=("--leave-group-on-shutdown",),
    )  # fmt: skip
    try:
        await asyncio.to_thread(a.wait_ready)
        await asyncio.to_thread(b.wait_ready)
        poll_until(
            lambda: (
                a.metrics().get("kbatch_assigned_partitions", 0) == 2
                and b.metrics().get("kbatch_assigned_partitions", 0) == 2
            ),
            60,
            "two partitions each",
        )
        loop = asyncio.get_running_loop()
        stopped = loop.time()
        b.stop()  # SIGTERM: drains, then leaves
        poll_until(
            lambda: a.metrics().get("kbatch_assigned_partitions", 0) == 4,
            SESSION_TIMEOUT_MS / 1000 / 3,
            "the leaving member's partitions at the other",
        )
        moved_s = loop.time() - stopped
        n = 40
        await produce(kafka_bootstrap, topics[0], [request(f"l-{i}", f"t {i}") for i in range(n)])
        keys = {f"l-{i}".encode() for i in range(n)}
        replies = await read_topic(
            kafka_bootstrap, topics[1], lambda rs: keys <= {r.key for r in rs}, 60
        )
    finally:
        a.stop()
        b.stop()
    print(f"\nstatic leave: partitions at the other member {moved_s:.1f} s after SIGTERM")
    assert "leaves the group on shutdown" in b.log_path.read_text(errors="replace")
    assert {r.key for r in replies} >= keys


async def test_a_duplicate_static_id_fences_one_member_with_one_clear_error(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory, tiny_embed_dir: Path
) -> None:
    topics = (await new_topic("req", 2), await new_topic("rep"), await new_topic("dlq"))
    group = unique_group("dupid")
    first = start(tmp_path, kafka_bootstrap, topics, group, tiny_embed_dir, "first", "same")
    second = None
    try:
        await asyncio.to_thread(first.wait_ready)
        second = start(tmp_path, kafka_bootstrap, topics, group, tiny_embed_dir, "second", "same")
        await asyncio.to_thread(second.wait_ready)
        code = await asyncio.to_thread(first.wait, 90)
        n = 50
        await produce(kafka_bootstrap, topics[0], [request(f"d-{i}", f"t {i}") for i in range(n)])
        keys = {f"d-{i}".encode() for i in range(n)}
        await read_topic(kafka_bootstrap, topics[1], lambda rs: keys <= {r.key for r in rs}, 120)
        assert second.proc is not None and second.proc.poll() is None, second.log_tail()
    finally:
        first.stop()
        if second is not None:
            second.stop()
    log = first.log_path.read_text(errors="replace")
    errors = [line for line in log.splitlines() if " ERROR " in line or "error" in line.lower()]
    print(f"\nduplicate static id: first exited {code}; its error lines: {errors[-3:]}")
    assert code == 1
    assert "Traceback" not in log
    assert any("group-instance-id" in line and "same" in line for line in errors)
