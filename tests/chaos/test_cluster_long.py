"""The longer cluster scenarios (``make chaos``; excluded from ``make test`` by the
``chaos_long`` marker): a partition leader's SIGKILL and SIGSTOP, a 120 s network cut, +200 ms
on every packet, a bandwidth limit, the transaction coordinator's SIGKILL under
``--exactly-once``, a freeze of a reply leader past the send deadline followed by the
transaction coordinator's SIGKILL against two ``--exactly-once`` members, and acks slower than
the send deadline (at-least-once: nothing repeated)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from consumer.kafka.transactional_ids import transactional_id
from tests.chaos.cluster import ChaosCluster
from tests.chaos.nodes import (
    freeze,
    kill,
    partition_leader,
    restart,
    thaw,
    transaction_coordinator,
)
from tests.chaos.scenario import Topics, network_cut, run_scenario, settle
from tests.integration.harness import poll_until

pytestmark = [pytest.mark.chaos_long, pytest.mark.timeout(900)]

LONG_CUT_S = 120.0
FREEZE_S = 20.0
"""Longer than ``broker.session.timeout.ms`` (9 s): the controller fences the frozen node and
moves its leaderships; it thaws with a stale view (a GC pause or a hung VM)."""
BANDWIDTH_BYTES_PER_S = 2 * 1024
"""Per direction and link: below what the ~30 requests/s load's fetches and replies need
(16 KiB/s changed nothing): a saturated link, not a cut; the backlog drains after it."""


def kill_and_restart(
    cc: ChaosCluster, topics: Topics, node_id: int, moved: Callable[[], bool]
) -> None:
    """SIGKILL node ``node_id``, wait until ``moved()`` is true (the role left it), restart it,
    wait until fully replicated again."""
    node = cc.cluster.node(node_id)
    kill(node)
    poll_until(moved, 60, f"the role to leave node {node_id}", every_s=0.5)
    restart(node)
    settle(cc, topics)


def freeze_leader_of(
    cc: ChaosCluster, topics: Topics, topic: str, seconds: float, partition: int = 0
) -> None:
    """SIGSTOP the leader of ``topic``'s ``partition`` for ``seconds``, SIGCONT it, wait until
    fully replicated again."""
    node = cc.cluster.node(asyncio.run(partition_leader(cc.bootstrap, topic, partition)))
    freeze(node)
    try:
        time.sleep(seconds)  # the fault's length, not a synchronisation
    finally:
        thaw(node)
    settle(cc, topics)


def kill_txn_coordinator(cc: ChaosCluster, topics: Topics) -> None:
    """SIGKILL the transaction coordinator of request partition 0's transactional id, restart
    it once the role moved (see :func:`kill_and_restart`)."""
    txn_id = transactional_id("kbatch", topics.group, (topics.requests, 0))
    node = asyncio.run(transaction_coordinator(cc.bootstrap, txn_id))
    kill_and_restart(
        cc, topics, node, lambda: asyncio.run(transaction_coordinator(cc.bootstrap, txn_id)) != node
    )


async def test_sigkill_of_the_request_partitions_leader_loses_nothing(
    chaos_cluster: ChaosCluster, tmp_path: Path, tiny_embed_dir: Path
) -> None:
    def kill_leader(cc: ChaosCluster, topics: Topics) -> None:
        leader = asyncio.run(partition_leader(cc.bootstrap, topics.requests, 0))
        kill_and_restart(
            cc,
            topics,
            leader,
            lambda: asyncio.run(partition_leader(cc.bootstrap, topics.requests, 0)) != leader,
        )

    result = await run_scenario(
        "kill-request-leader", chaos_cluster, tmp_path, tiny_embed_dir, kill_leader
    )
    assert result.lost == 0


async def test_sigstop_of_the_request_partitions_leader_loses_nothing(
    chaos_cluster: ChaosCluster, tmp_path: Path, tiny_embed_dir: Path
) -> None:
    # A frozen node answers nothing but keeps its sockets open: clients wait for timeouts
    # instead of seeing a refused connection (Jepsen's pause nemesis).
    def freeze_leader(cc: ChaosCluster, topics: Topics) -> None:
        freeze_leader_of(cc, topics, topics.requests, FREEZE_S)

    result = await run_scenario(
        "sigstop-request-leader", chaos_cluster, tmp_path, tiny_embed_dir, freeze_leader
    )
    assert result.lost == 0


async def test_a_bandwidth_limit_on_every_link_loses_nothing(
    chaos_cluster: ChaosCluster, tmp_path: Path, tiny_embed_dir: Path
) -> None:
    def throttle(cc: ChaosCluster, topics: Topics) -> None:
        cc.proxies.set_bandwidth(BANDWIDTH_BYTES_PER_S)
        try:
            time.sleep(30)  # the fault's length, not a synchronisation
        finally:
            cc.proxies.set_bandwidth(None)

    result = await run_scenario("bandwidth-2KiB", chaos_cluster, tmp_path, tiny_embed_dir, throttle)
    assert result.lost == 0


async def test_a_120_s_network_cut_then_heal_loses_nothing(
    chaos_cluster: ChaosCluster, tmp_path: Path, tiny_embed_dir: Path
) -> None:
    # Parallel Consumer's broker-disconnect test: a long cut, then every record processed.
    result = await run_scenario(
        "network-cut-120s",
        chaos_cluster,
        tmp_path,
        tiny_embed_dir,
        network_cut(LONG_CUT_S),
        answer_timeout_s=300,
    )
    assert result.lost == 0


async def test_200_ms_on_every_packet_loses_nothing(
    chaos_cluster: ChaosCluster, tmp_path: Path, tiny_embed_dir: Path
) -> None:
    def slow(cc: ChaosCluster, topics: Topics) -> None:
        cc.proxies.set_delay(0.2)
        time.sleep(30)  # the fault's length, not a synchronisation
        cc.proxies.set_delay(0.0)

    result = await run_scenario("latency-200ms", chaos_cluster, tmp_path, tiny_embed_dir, slow)
    assert result.lost == 0
    assert result.rebalances == 0


async def test_sigkill_of_the_transaction_coordinator_under_exactly_once(
    chaos_cluster: ChaosCluster, tmp_path: Path, tiny_embed_dir: Path
) -> None:
    # Kafka's transactions_test.py (hard bounce of brokers): zero duplicates; Jepsen: no G1a.
    result = await run_scenario(
        "kill-txn-coordinator",
        chaos_cluster,
        tmp_path,
        tiny_embed_dir,
        kill_txn_coordinator,
        exactly_once=True,
    )
    assert result.lost == 0
    assert result.duplicates == 0
    assert result.g1a == 0


SLOW_ACK_DELAY_S = 6.0
"""Per packet and direction: a produce round trip takes 12 s, past a 5 s send deadline."""

EOS_FREEZE_S = 40.0
"""Longer than the default ``--send-timeout-ms`` (30 s), so replies and
commits of the frozen leader's partitions get no verdict in time."""


async def test_freeze_then_kill_of_reply_leader_and_txn_coordinator_under_exactly_once(
    chaos_cluster: ChaosCluster, tmp_path: Path, tiny_embed_dir: Path
) -> None:
    # Regression: two --exactly-once members with static ids; the leader of a reply
    # partition frozen 40 s, then the transaction coordinator of request partition 0 killed
    # and restarted. Every acknowledged request answered exactly once to a read_committed
    # reader, no aborted reply seen, no member exit, both ready again.
    def freeze_then_kill(cc: ChaosCluster, topics: Topics) -> None:
        freeze_leader_of(cc, topics, topics.replies, EOS_FREEZE_S)
        kill_txn_coordinator(cc, topics)

    result = await run_scenario(
        "eos-freeze-reply-leader-then-kill-txn-coordinator",
        chaos_cluster,
        tmp_path,
        tiny_embed_dir,
        freeze_then_kill,
        exactly_once=True,
        members=2,
        ready_after=True,
        answer_timeout_s=300,
    )
    assert (result.lost, result.duplicates, result.g1a) == (0, 0, 0)


async def test_acks_slower_than_the_send_deadline_repeat_nothing(
    chaos_cluster: ChaosCluster, tmp_path: Path, tiny_embed_dir: Path
) -> None:
    # Regression (at-least-once): once the send deadline passed, kbatch sent the replies
    # again beside the producer's own retry of the first copy, and both landed: keys answered
    # twice without a crash or a rebalance. Here every packet takes 6 s each way for 15 s, so
    # every reply's ack comes after the 5 s deadline while its first copy is being written.
    def slow(cc: ChaosCluster, topics: Topics) -> None:
        cc.proxies.set_delay(SLOW_ACK_DELAY_S)
        time.sleep(15)  # the fault's length, not a synchronisation
        cc.proxies.set_delay(0.0)

    result = await run_scenario(
        "acks-past-send-deadline",
        chaos_cluster,
        tmp_path,
        tiny_embed_dir,
        slow,
        extra=["--send-timeout-ms", "5000", "--session-timeout-ms", "45000"],
        answer_timeout_s=300,
    )
    assert (result.lost, result.duplicates, result.rebalances) == (0, 0, 0)
