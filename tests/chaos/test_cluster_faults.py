"""Broker and network faults under load, against a three-node cluster (part of ``make test``).

Each scenario runs one ``kbatch serve`` at ~30 requests/s through the proxies and checks the
history (tests/chaos/history.py): nothing acknowledged is lost, and the faults that Kafka's own
system tests hold to zero rebalances cause none. The figures are printed (``chaos-result``)
and tabled in docs/CLUSTER.md; the longer scenarios are in ``test_cluster_long.py``
(``make chaos``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.chaos.cluster import ChaosCluster
from tests.chaos.nodes import group_coordinator, kill, restart
from tests.chaos.scenario import Topics, network_cut, run_scenario, settle
from tests.integration.harness import poll_until

pytestmark = pytest.mark.timeout(600)

SHORT_CUT_S = 20.0


async def test_rolling_bounce_of_all_brokers_loses_nothing_and_rebalances_never(
    chaos_cluster: ChaosCluster, tmp_path: Path, tiny_embed_dir: Path
) -> None:
    # Kafka's consumer_test.py (test_broker_rolling_bounce): zero unexpected rebalances.
    def bounce(cc: ChaosCluster, topics: Topics) -> None:
        for node in cc.cluster.members:
            node.stop()  # SIGTERM: a controlled shutdown moves its leaderships first
            node.start()
            settle(cc, topics)

    result = await run_scenario("rolling-bounce", chaos_cluster, tmp_path, tiny_embed_dir, bounce)
    assert result.lost == 0
    assert result.rebalances == 0
    assert result.acked > 0


async def test_sigkill_of_the_group_coordinator_loses_nothing(
    chaos_cluster: ChaosCluster, tmp_path: Path, tiny_embed_dir: Path
) -> None:
    def kill_coordinator(cc: ChaosCluster, topics: Topics) -> None:
        node = cc.cluster.node(asyncio.run(group_coordinator(cc.bootstrap, topics.group)))
        kill(node)
        # Until the controller declares the node dead (broker.session.timeout.ms, 9 s), the
        # metadata still names it: wait for another coordinator, then bring it back.
        poll_until(
            lambda: asyncio.run(group_coordinator(cc.bootstrap, topics.group)) != node.node_id,
            60,
            "the group coordinator to move",
            every_s=0.5,
        )
        restart(node)
        settle(cc, topics)

    result = await run_scenario(
        "kill-group-coordinator", chaos_cluster, tmp_path, tiny_embed_dir, kill_coordinator
    )
    assert result.lost == 0
    assert result.rebalances == 0  # the new coordinator loads the group from __consumer_offsets


async def test_a_short_network_cut_then_heal_loses_nothing(
    chaos_cluster: ChaosCluster, tmp_path: Path, tiny_embed_dir: Path
) -> None:
    result = await run_scenario(
        "network-cut-20s",
        chaos_cluster,
        tmp_path,
        tiny_embed_dir,
        network_cut(SHORT_CUT_S),
        answer_timeout_s=240,
    )
    assert result.lost == 0
    # Longer than --session-timeout-ms (10 s): the member is dropped and rejoins once.
    assert result.rebalances <= 1


EOS_CUT_S = 8.0
"""Longer than the scenario's ``--send-timeout-ms`` (3 s), shorter than its session timeout
(10 s): sends and commits get no verdict, the member stays in its group."""


async def test_a_cut_past_the_send_deadline_under_exactly_once_recovers_in_place(
    chaos_cluster: ChaosCluster, tmp_path: Path, tiny_embed_dir: Path
) -> None:
    # Issue 36 item 1: a transaction without a verdict stopped the member (exit 1). Now its
    # producer is replaced and its partition rewound to the committed offset, in place.
    result = await run_scenario(
        "eos-cut-past-send-deadline",
        chaos_cluster,
        tmp_path,
        tiny_embed_dir,
        network_cut(EOS_CUT_S),
        exactly_once=True,
        extra=["--send-timeout-ms", "3000"],
        ready_after=True,
        answer_timeout_s=240,
    )
    assert (result.lost, result.duplicates, result.g1a) == (0, 0, 0)
    assert result.recoveries >= 1  # the fault did reach a transaction
