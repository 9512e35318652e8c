"""A local multi-node Apache Kafka cluster (KRaft, combined broker+controller nodes) for tests.

``kbatch broker start --nodes 3`` runs three nodes, each one JVM with the heap of
:data:`consumer.broker.local.HEAP_OPTS`; the jars are the single broker's
(:meth:`LocalBroker.ensure_jars`). Ports, for ``--port P`` and ``n`` nodes, node ``i`` (id
``i + 1``, ``i`` from 0):

==================  ===============  ===========================================
client listener     ``P + i``        what clients bootstrap from (``PLAINTEXT``)
controller          ``P + n + i``    the KRaft quorum (static voters, all ``n`` nodes)
inter-broker        ``P + 2n + i``   replication (``INTERNAL``), never proxied
==================  ===============  ===========================================

The client listener may advertise another port (``advertised_ports``): the chaos tests put a
TCP proxy there (``tests/chaos/proxy.py``) so a cut or a delay hits kbatch's connections and
not the replication between brokers.

Replication: created topics default to ``n`` replicas (at most 3) with ``min.insync.replicas``
one less (at least 1): with three nodes, ``acks=all`` survives one node down. The group
offsets and transaction state topics are replicated the same way. Data, logs and pids live in
``<cache>/cluster-<P>/node-<id>/``; ``cluster.json`` there records the node count, so
``kbatch broker stop|status --port P`` find the cluster.

Errors raised: :class:`BrokerError` with a one-line message that says what to do.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from consumer.broker.local import (
    KAFKA_VERSION,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    BrokerError,
    LocalBroker,
    cache_root,
    new_cluster_id,
    port_is_open,
)
from consumer.broker.secure import SecureBroker

MAX_NODES: Final = 5
REPLICA_LAG_TIME_MAX_MS: Final = 10_000
"""A follower silent this long leaves the ISR (Kafka's default is 30 s): a frozen node then
blocks ``acks=all`` writes for ten seconds, not thirty."""


def cluster_home(port: int) -> Path:
    """``<cache>/cluster-<port>``: ``cluster.json``, ``cluster.id`` and one ``node-<id>``
    directory per node."""
    return cache_root() / f"cluster-{port}"


def _node_properties(node: ClusterNode) -> str:
    """The settings of one combined node: static voters, three listeners, replication ``n``."""
    replicas = min(node.nodes, 3)
    min_isr = max(replicas - 1, 1)
    voters = ",".join(
        f"{i + 1}@127.0.0.1:{node.base_port + node.nodes + i}" for i in range(node.nodes)
    )
    return "\n".join(
        [
            "process.roles=broker,controller",
            f"node.id={node.node_id}",
            f"controller.quorum.voters={voters}",
            f"listeners=PLAINTEXT://127.0.0.1:{node.port},"
            f"INTERNAL://127.0.0.1:{node.internal_port},"
            f"CONTROLLER://127.0.0.1:{node._controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{node.advertised_port},"
            f"INTERNAL://127.0.0.1:{node.internal_port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=INTERNAL",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,"
            "INTERNAL:PLAINTEXT",
            f"log.dirs={node.home / 'data'}",
            "num.partitions=1",
            f"default.replication.factor={replicas}",
            f"min.insync.replicas={min_isr}",
            f"offsets.topic.replication.factor={replicas}",
            "offsets.topic.num.partitions=10",
            f"transaction.state.log.replication.factor={replicas}",
            f"transaction.state.log.min.isr={min_isr}",
            "transaction.state.log.num.partitions=4",
            f"replica.lag.time.max.ms={REPLICA_LAG_TIME_MAX_MS}",
            "group.initial.rebalance.delay.ms=0",
            "auto.create.topics.enable=false",
            "delete.topic.enable=true",
            "log.segment.bytes=67108864",
            "",
        ]
    )


@dataclass(frozen=True)
class ClusterNode(LocalBroker):
    """One node of a :class:`LocalCluster`: a :class:`LocalBroker` with the cluster's ports,
    voters and shared cluster id. ``start``, ``stop`` and ``kill`` act on this node only (a
    restart of a stopped node rejoins the cluster with its data)."""

    node_id: int = 1
    nodes: int = 3
    base_port: int = 0
    advertised: int | None = None

    @property
    def index(self) -> int:
        """0-based position in the cluster (``node_id - 1``)."""
        return self.node_id - 1

    @property
    def internal_port(self) -> int:
        """The inter-broker (replication) listener."""
        return self.base_port + 2 * self.nodes + self.index

    @property
    def advertised_port(self) -> int:
        """The client port the node advertises in metadata (a proxy's, when one is set)."""
        return self.advertised if self.advertised is not None else self.port

    @property
    def home(self) -> Path:
        return cluster_home(self.base_port) / f"node-{self.node_id}"

    def _properties(self) -> str:
        return _node_properties(self)

    def _cluster_id(self) -> str:
        return (cluster_home(self.base_port) / "cluster.id").read_text().strip()

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the node's JVM (``SIGSTOP`` freezes it, ``SIGCONT`` thaws it).

        Raises:
            BrokerError: the node is not running.
        """
        pid = self.pid()
        if pid is None:
            raise BrokerError(f"node {self.node_id} of the cluster at {self.base_port} is down")
        os.kill(pid, sig)


@dataclass(frozen=True)
class LocalCluster:
    """``nodes`` combined KRaft nodes on ``127.0.0.1`` (module docstring: ports, replication).

    Args:
        port: the first node's client port.
        nodes: how many nodes (2 to :data:`MAX_NODES`).
        kafka_version: the Kafka release (as :class:`LocalBroker`).
        advertised_ports: per node, the client port advertised instead of its own (a proxy).
    """

    port: int
    nodes: int = 3
    kafka_version: str = KAFKA_VERSION
    advertised_ports: tuple[int, ...] | None = None
    _members: tuple[ClusterNode, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 2 <= self.nodes <= MAX_NODES:
            raise BrokerError(f"--nodes {self.nodes}: a cluster has 2 to {MAX_NODES} nodes")
        if self.advertised_ports is not None and len(self.advertised_ports) != self.nodes:
            raise BrokerError(
                f"{len(self.advertised_ports)} advertised ports for {self.nodes} nodes"
            )
        members = tuple(
            ClusterNode(
                port=self.port + i,
                controller_port=self.port + self.nodes + i,
                kafka_version=self.kafka_version,
                node_id=i + 1,
                nodes=self.nodes,
                base_port=self.port,
                advertised=None if self.advertised_ports is None else self.advertised_ports[i],
            )
            for i in range(self.nodes)
        )
        object.__setattr__(self, "_members", members)

    @classmethod
    def recorded(cls, port: int) -> LocalCluster | None:
        """The cluster started at ``port`` before (from its ``cluster.json``), else None."""
        try:
            info = json.loads((cluster_home(port) / "cluster.json").read_text())
            return cls(port=port, nodes=int(info["nodes"]), kafka_version=info["kafka_version"])
        except (OSError, ValueError, KeyError):
            return None

    @property
    def home(self) -> Path:
        return cluster_home(self.port)

    @property
    def members(self) -> tuple[ClusterNode, ...]:
        """The nodes, by index (node id ``i + 1``)."""
        return self._members

    def node(self, node_id: int) -> ClusterNode:
        """The node with Kafka node id ``node_id`` (1-based, as in metadata)."""
        return self._members[node_id - 1]

    @property
    def bootstrap(self) -> str:
        """Every node's advertised client address, comma-separated."""
        return ",".join(f"127.0.0.1:{n.advertised_port}" for n in self._members)

    @property
    def ports(self) -> list[int]:
        """Every port the cluster listens on (client, controller, inter-broker)."""
        return list(range(self.port, self.port + 3 * self.nodes))

    def start(self, *, fresh: bool = False, timeout_s: float = START_TIMEOUT_S) -> str:
        """Start every node not running yet, together (a KRaft quorum needs a majority up
        before any node answers); wait until each answers a metadata request.

        Returns:
            The bootstrap addresses.

        Raises:
            BrokerError: a missing tool, a port held by another program, or a node that did
                not answer in time.
        """
        if fresh:
            self.stop()
            for member in self._members:
                shutil.rmtree(member.home / "data", ignore_errors=True)
        if all(m.pid() is None for m in self._members):
            for port in self.ports:
                if port_is_open(port):
                    raise BrokerError(
                        f"port {port} is taken by another program: a {self.nodes}-node cluster "
                        f"at --port {self.port} needs ports {self.ports[0]}-{self.ports[-1]}"
                    )
        self._members[0].ensure_jars()
        self.home.mkdir(parents=True, exist_ok=True)
        id_file = self.home / "cluster.id"
        if not id_file.exists() or not any((m.home / "data").exists() for m in self._members):
            id_file.write_text(new_cluster_id())
        (self.home / "cluster.json").write_text(
            json.dumps({"nodes": self.nodes, "kafka_version": self.kafka_version})
        )
        with ThreadPoolExecutor(self.nodes) as pool:
            results = list(pool.map(lambda m: _start_node(m, timeout_s), self._members))
        failed = [err for err in results if err is not None]
        if failed:
            raise failed[0]
        return self.bootstrap

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> bool:
        """Stop every node, together (SIGTERM, then SIGKILL after ``timeout_s``); data stays.

        Returns:
            True when at least one node was running.
        """
        with ThreadPoolExecutor(self.nodes) as pool:
            return any(list(pool.map(lambda m: m.stop(timeout_s), self._members)))

    def kill(self) -> None:
        """SIGKILL every node (test cleanup); data stays."""
        for member in self._members:
            member.kill()

    def status(self) -> list[bool]:
        """Per node, whether it answers a metadata request on its own client port."""
        return [m.status() for m in self._members]


def _start_node(node: ClusterNode, timeout_s: float) -> BrokerError | None:
    try:
        node.start(timeout_s=timeout_s)
    except BrokerError as err:
        return err
    return None


def stop_at(port: int) -> bool:
    """Stop whatever kbatch started at ``port``: the single broker, a cluster, the secured
    broker (``--secure``), or several of them.

    Returns:
        True when something was running.
    """
    stopped = LocalBroker(port=port).stop()
    secure = SecureBroker(port=port)
    if secure.home.exists():
        stopped = secure.stop() or stopped
    cluster = LocalCluster.recorded(port)
    if cluster is not None:
        stopped = cluster.stop() or stopped
    return stopped


def status_at(port: int) -> tuple[bool, str]:
    """Whether what kbatch started at ``port`` answers, and a one-line description: a cluster
    answers when every node does (``kbatch broker status`` exits 1 otherwise)."""
    cluster = LocalCluster.recorded(port)
    if cluster is not None and any(m.pid() is not None for m in cluster.members):
        up = cluster.status()
        nodes = ", ".join(
            f"{m.node_id}@{m.bootstrap} {'up' if ok else 'down'}"
            for m, ok in zip(cluster.members, up, strict=True)
        )
        return all(up), f"cluster of {cluster.nodes}: {nodes}"
    secure = SecureBroker(port=port)
    if secure.pid() is not None:  # asked over SASL_SSL as its admin
        if secure.status():
            return True, f"secured broker running at {secure.bootstrap} (SASL_SSL)"
        return False, f"secured broker not answering at {secure.bootstrap}"
    broker = LocalBroker(port=port)
    if broker.status():
        return True, f"running at {broker.bootstrap}"
    return False, f"not answering at {broker.bootstrap}"
