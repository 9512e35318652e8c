"""Which node to hit, and hitting it: partition leader, group coordinator, transaction
coordinator; SIGSTOP / SIGKILL / restart of one node of a :class:`LocalCluster`.

The roles are asked of the cluster itself: the partition leader from a metadata response, the
coordinators with Kafka's ``FindCoordinator`` (key type 0 = group, 1 = transaction), both
through aiokafka's client (``AIOKafkaClient.coordinator_lookup``).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable

from aiokafka import AIOKafkaClient
from aiokafka.client import CoordinationType
from aiokafka.errors import KafkaError

from consumer.broker.cluster import ClusterNode, LocalCluster


async def _with_client(bootstrap: str, timeout_s: float = 20.0) -> AIOKafkaClient:
    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    await asyncio.wait_for(client.bootstrap(), timeout_s)
    return client


async def partition_leader(bootstrap: str, topic: str, partition: int) -> int:
    """The node id that leads ``topic``/``partition`` now.

    Raises:
        AssertionError: the partition has no leader in the metadata.
    """
    leader = (await topic_metadata(bootstrap, topic))[partition][0]
    assert leader >= 0, f"{topic}/{partition} has no leader"
    return leader


async def _coordinator(bootstrap: str, kind: CoordinationType, key: str, timeout_s: float) -> int:
    """FindCoordinator, asked again while the coordinator is not available (the first lookup
    creates the internal topic; a moved coordinator takes a moment to load)."""
    client = await _with_client(bootstrap)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                return int(await client.coordinator_lookup(kind, key))
            except KafkaError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)  # the next lookup (not a synchronisation)
    finally:
        await client.close()


async def group_coordinator(bootstrap: str, group_id: str, timeout_s: float = 30) -> int:
    """The node id coordinating consumer group ``group_id`` (FindCoordinator, key type 0)."""
    return await _coordinator(bootstrap, CoordinationType.GROUP, group_id, timeout_s)


async def transaction_coordinator(
    bootstrap: str, transactional_id: str, timeout_s: float = 30
) -> int:
    """The node id coordinating ``transactional_id`` (FindCoordinator, key type 1)."""
    return await _coordinator(bootstrap, CoordinationType.TRANSACTION, transactional_id, timeout_s)


async def topic_metadata(bootstrap: str, topic: str) -> dict[int, tuple[int, list[int]]]:
    """Per partition of ``topic``: its leader's node id (-1: none) and in-sync replica ids."""
    from aiokafka.protocol.metadata import MetadataRequest

    client = await _with_client(bootstrap)
    try:
        response = None
        for broker in client.cluster.brokers():  # the first that answers (one may be down)
            try:
                response = await client.send(broker.nodeId, MetadataRequest([topic]))
                break
            except KafkaError:
                continue
        assert response is not None, f"no broker answered a metadata request at {bootstrap}"
    finally:
        await client.close()
    out: dict[int, tuple[int, list[int]]] = {}
    for entry in response.topics:  # (error, name, [is_internal,] partitions) by version
        if entry[1] == topic:
            for p in entry[-1]:  # (error, partition, leader, replicas, isr[, offline])
                out[int(p[1])] = (int(p[2]), [int(n) for n in p[4]])
    return out


async def wait_fully_replicated(
    bootstrap: str, topics: list[str], nodes: int, timeout_s: float = 90.0
) -> float:
    """Poll until every partition of ``topics`` has all ``nodes`` replicas in sync; the seconds
    it took.

    Raises:
        AssertionError: not in time.
    """
    started = time.monotonic()
    while True:
        isr = {t: await topic_metadata(bootstrap, t) for t in topics}
        if all(isr[t] and all(len(r[1]) == nodes for r in isr[t].values()) for t in topics):
            return time.monotonic() - started
        assert time.monotonic() - started < timeout_s, f"not fully replicated: {isr}"
        await asyncio.sleep(0.5)  # the next metadata sample (not a synchronisation)


def freeze(node: ClusterNode) -> None:
    """SIGSTOP the node's JVM (a GC pause or a hung VM, as seen from outside)."""
    node.signal(signal.SIGSTOP)


def thaw(node: ClusterNode) -> None:
    """SIGCONT a frozen node."""
    node.signal(signal.SIGCONT)


def kill(node: ClusterNode) -> None:
    """SIGKILL the node (its data stays for :func:`restart`)."""
    node.kill()


def restart(node: ClusterNode, timeout_s: float = 120.0) -> float:
    """Start a stopped or killed node again; the seconds until it answered."""
    started = time.monotonic()
    node.start(timeout_s=timeout_s)
    return time.monotonic() - started


def rolling_bounce(
    cluster: LocalCluster, settle: Callable[[], object] | None = None
) -> list[float]:
    """Stop (SIGTERM: controlled shutdown) and restart each node in turn; ``settle()`` runs
    after each restart (e.g. wait until fully replicated). Returns each node's seconds down."""
    downs = []
    for node in cluster.members:
        stopped = time.monotonic()
        node.stop()
        node.start()
        downs.append(time.monotonic() - stopped)
        if settle is not None:
            settle()
    return downs
