"""How many replicas a topic kbatch creates gets, and whether one topic is less durable than
another (a jobs topic of one replica on a three-node cluster would stop the jobs when that
node fails).

Pure rules (:func:`choose_replication`, :func:`replication_warning`,
:meth:`Durability.weaker_than`) and the admin calls that feed them (:func:`cluster_replication`,
:func:`cluster_min_insync`, :func:`topic_durability`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError

__all__ = [
    "Durability",
    "choose_replication",
    "cluster_min_insync",
    "cluster_replication",
    "read_config",
    "replication_warning",
    "topic_durability",
]

FALLBACK_MAX_REPLICAS = 3
"""Replicas when the cluster's default cannot be read: ``min(3, brokers)``."""

RECOMMENDED_REPLICAS = 3
"""The fewest replicas of a topic kbatch creates without a warning: Kafka's documentation's
production setting (replication factor 3 with ``min.insync.replicas`` 2) survives the loss of
one broker with every acknowledged record and keeps accepting writes."""


@dataclass(frozen=True, slots=True)
class Durability:
    """What a topic survives.

    Attributes:
        replicas: the fewest replicas of any of its partitions.
        min_insync: its effective ``min.insync.replicas`` (its own, else the broker's), None
            where the broker did not say (ACLs without DescribeConfigs).
    """

    replicas: int
    min_insync: int | None

    def weaker_than(self, other: Durability) -> bool:
        """Fewer replicas than ``other``, or a lower ``min.insync.replicas`` (compared only
        where both are known): a broker loss ``other`` survives may lose this topic's
        acknowledged writes or leave it without a leader."""
        if self.replicas < other.replicas:
            return True
        if self.min_insync is None or other.min_insync is None:
            return False
        return self.min_insync < other.min_insync

    def __str__(self) -> str:
        isr = "?" if self.min_insync is None else str(self.min_insync)
        return f"{self.replicas} replica(s), min.insync.replicas {isr}"


def choose_replication(
    requested: int | None, cluster_default: int | None, brokers: int
) -> tuple[int, str]:
    """The replication factor of a topic to create, and why (for the log line).

    ``requested`` (a flag) wins; else the cluster's ``default.replication.factor`` (what
    Kafka's own AdminClient asks for by sending -1, KIP-464; aiokafka 0.14 speaks CreateTopics
    v0–v3 only, which has no -1, so it is read from the broker's configuration); else, where
    the broker does not say, ``min(3, brokers)``. ``min.insync.replicas`` is left to the
    broker's default, as for every topic kbatch creates.

    Raises:
        ValueError: ``brokers`` < 1 without a requested or default factor.
    """
    if requested is not None:
        return requested, "as requested"
    if cluster_default is not None and cluster_default >= 1:
        return cluster_default, "the cluster's default.replication.factor"
    if brokers < 1:
        raise ValueError("no broker in the cluster metadata")
    replicas = min(FALLBACK_MAX_REPLICAS, brokers)
    return replicas, f"min({FALLBACK_MAX_REPLICAS}, {brokers} brokers)"


def replication_warning(replicas: int, min_insync: int | None) -> str | None:
    """Why a topic created with ``replicas`` replicas, under the broker's ``min.insync.replicas``
    ``min_insync`` (None: not known), is fragile, or None when it is not: fewer than
    :data:`RECOMMENDED_REPLICAS` (a broker loss can lose acknowledged records or leave a
    partition without a leader), or not more than ``min_insync`` (one broker down refuses every
    ``acks=all`` write, as kbatch's replies and dead letters are sent)."""
    problems = []
    if replicas < RECOMMENDED_REPLICAS:
        problems.append(
            f"fewer than {RECOMMENDED_REPLICAS}: a broker loss can lose acknowledged records"
        )
    if min_insync is not None and replicas < min_insync + 1:
        problems.append(
            f"not more than min.insync.replicas={min_insync}: one broker down refuses every "
            "acks=all write"
        )
    return "; ".join(problems) or None


async def _config_node(admin: AIOKafkaAdminClient) -> tuple[int | None, int]:
    """``(the controller, else the first broker; brokers)``; None when there is none."""
    cluster = await admin.describe_cluster()
    brokers = [int(b["node_id"]) for b in cluster.get("brokers", [])]
    if not brokers:
        return None, 0
    controller = cluster.get("controller_id")
    return (controller if controller in brokers else brokers[0]), len(brokers)


async def cluster_min_insync(admin: AIOKafkaAdminClient) -> int | None:
    """The broker's default ``min.insync.replicas`` (the controller's, else the first
    broker's), None where it does not say (denied) or there is no broker.

    Raises:
        KafkaError: the cluster metadata could not be read.
    """
    node, _ = await _config_node(admin)
    if node is None:
        return None
    value = await read_config(admin, ConfigResourceType.BROKER, str(node), "min.insync.replicas")
    return int(value) if value is not None else None


async def cluster_replication(admin: AIOKafkaAdminClient) -> tuple[int | None, int]:
    """``(default.replication.factor or None, brokers)``: the broker's default as the
    controller (else the first broker) reports it, None where it does not say (denied).

    Raises:
        KafkaError: the cluster metadata could not be read.
    """
    node, brokers = await _config_node(admin)
    if node is None:
        return None, 0
    value = await read_config(
        admin, ConfigResourceType.BROKER, str(node), "default.replication.factor"
    )
    return (int(value) if value is not None else None), brokers


async def topic_durability(admin: AIOKafkaAdminClient, topic: str) -> Durability | None:
    """``topic``'s :class:`Durability`, or None when it does not exist or has no partition.

    Raises:
        KafkaError: the metadata could not be read.
    """
    described: list[dict[str, Any]] = await admin.describe_topics([topic])
    partitions = [p for t in described if t.get("error_code", 0) == 0 for p in t["partitions"]]
    if not partitions:
        return None
    replicas = min(len(p["replicas"]) for p in partitions)
    isr = await read_config(admin, ConfigResourceType.TOPIC, topic, "min.insync.replicas")
    return Durability(replicas, int(isr) if isr is not None else None)


async def read_config(
    admin: AIOKafkaAdminClient, kind: ConfigResourceType, name: str, key: str
) -> str | None:
    """One configuration value of a broker or topic (its effective value: the topic's own,
    else the broker's), None when the broker does not say (denied, missing)."""
    try:
        responses = await admin.describe_configs([ConfigResource(kind, name, {key: None})])
    except KafkaError:
        return None
    for response in responses:
        for error_code, _message, _type, _name, entries, *_ in response.resources:
            if error_code != 0:
                return None
            for entry_name, value, *_ in entries:
                if entry_name == key:
                    return None if value is None else str(value)
    return None


def fragile_topics_message(
    topics: list[str], replicas: int, why: str, warning: str, brokers: int
) -> str:
    """The WARNING line for ``topics`` just created with ``replicas`` replicas (``why``: how
    that was chosen), fragile as ``warning`` says (:func:`replication_warning`). On a
    one-broker cluster (``brokers`` == 1: ``kbatch broker start``, a development broker) no
    replication is possible, so the line says so briefly instead of naming remedies that need
    more brokers."""
    if brokers == 1:
        return (
            f"topics {topics} have 1 replica: a one-broker cluster keeps no copy (fine for "
            "development; in production use 3 brokers and replication factor 3)"
        )
    return (
        f"topics {topics} were created with {replicas} replica(s) ({why}), {warning}: raise the "
        "cluster's default.replication.factor or give a replication factor (serve: "
        "--topic-replication-factor), and reassign these (kafka-reassign-partitions)"
    )
