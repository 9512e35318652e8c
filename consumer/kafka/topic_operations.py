"""May this principal write a topic? The broker's own answer (KIP-430), asked before a record
enters a transaction.

Why: inside a transaction the first record for a topic makes the producer add the topic's
partition to the transaction (``AddPartitionsToTxn``); a topic the ACLs let kbatch describe but
not write is refused there, and aiokafka then fails the whole transaction (an abortable
error), not the one record — under ``--exactly-once`` one such request aborted its partition's
transaction at every try. Asked first, such a record fails alone with
:class:`~consumer.kafka.errors.DeliveryDeniedError` and is dead-lettered
``reply_topic_not_allowed`` like at-least-once does, and the transaction commits.

How: a Metadata request of version 8 with ``include_topic_authorized_operations`` (KIP-430,
Kafka 2.3+) answers, per topic, the operations the principal may perform, as a bit field of
Kafka's ``AclOperation`` codes. aiokafka 0.14 knows Metadata up to version 5, so the version 8
structs are declared here, field for field as Kafka's ``MetadataRequest.json``/
``MetadataResponse.json`` give them. A broker that does not answer, or cannot (an older one),
gives no verdict: the record is sent as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaError, TopicAuthorizationFailedError
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Boolean, Int16, Int32, Schema, String

from consumer.kafka.sink_timing import VERDICT_TTL_S

__all__ = ["VERDICT_TTL_S", "WRITE", "WriteVerdicts", "write_verdicts"]

WRITE = 4
"""Kafka's ``AclOperation.WRITE`` code: bit ``1 << 4`` of ``topic_authorized_operations``."""

NOT_REQUESTED = -(2**31)
"""``topic_authorized_operations`` when the broker did not compute it."""


class _MetadataResponseV8(Response):  # type: ignore[misc]
    API_KEY = 3
    API_VERSION = 8
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "brokers",
            Array(
                ("node_id", Int32),
                ("host", String("utf-8")),
                ("port", Int32),
                ("rack", String("utf-8")),
            ),
        ),
        ("cluster_id", String("utf-8")),
        ("controller_id", Int32),
        (
            "topics",
            Array(
                ("error_code", Int16),
                ("topic", String("utf-8")),
                ("is_internal", Boolean),
                (
                    "partitions",
                    Array(
                        ("error_code", Int16),
                        ("partition", Int32),
                        ("leader", Int32),
                        ("leader_epoch", Int32),
                        ("replicas", Array(Int32)),
                        ("isr", Array(Int32)),
                        ("offline_replicas", Array(Int32)),
                    ),
                ),
                ("topic_authorized_operations", Int32),
            ),
        ),
        ("cluster_authorized_operations", Int32),
    )


class _MetadataRequestV8(RequestStruct):  # type: ignore[misc]
    API_KEY = 3
    API_VERSION = 8
    RESPONSE_TYPE = _MetadataResponseV8
    SCHEMA = Schema(
        ("topics", Array(String("utf-8"))),
        ("allow_auto_topic_creation", Boolean),
        ("include_cluster_authorized_operations", Boolean),
        ("include_topic_authorized_operations", Boolean),
    )


class TopicOperationsRequest(Request[_MetadataRequestV8]):  # type: ignore[misc]
    """Metadata v8 for ``topics``, with each one's authorized operations, creating none."""

    API_KEY = 3

    def __init__(self, topics: list[str]) -> None:
        self._topics = topics

    def build(self, request_struct_class: type[_MetadataRequestV8]) -> _MetadataRequestV8:
        return request_struct_class(self._topics, False, False, True)


async def write_verdicts(client: AIOKafkaClient, topics: Iterable[str]) -> dict[str, bool]:
    """Per topic of ``topics``: False when the broker says this principal may not write it
    (WRITE missing from its authorized operations, or the topic hidden by the ACLs:
    ``TOPIC_AUTHORIZATION_FAILED``), True when it may. Topics without a verdict (missing, the
    broker not answering or too old for version 8) are left out: the caller sends as before.
    Asked through ``client`` (a started aiokafka client), one request for all."""
    wanted = sorted(set(topics))
    node_id = client.get_random_node()
    if node_id is None or not wanted:
        return {}
    try:
        response = await client.send(node_id, TopicOperationsRequest(wanted))
    except (KafkaError, NotImplementedError):  # NotImplementedError: no version 8 there
        return {}
    verdicts: dict[str, bool] = {}
    for code, name, _internal, _partitions, operations in response.topics:
        if name not in wanted:
            continue
        if code == TopicAuthorizationFailedError.errno:
            verdicts[name] = False
        elif code == 0 and operations != NOT_REQUESTED:
            verdicts[name] = bool(operations & (1 << WRITE))
    return verdicts


class WriteVerdicts:
    """:func:`write_verdicts` kept :data:`VERDICT_TTL_S` seconds per topic, shared by the
    producers of one :class:`~consumer.kafka.transactions.TransactionalSink`; a topic without
    a verdict counts as writable for as long. Loop thread only."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple[bool, float]] = {}  # topic → (writable, expiry loop time)

    async def denied(self, client: AIOKafkaClient, topics: set[str]) -> frozenset[str]:
        """Those of ``topics`` this principal may not write (asking the broker about the
        ones without a kept verdict)."""
        now = asyncio.get_running_loop().time()
        kept = self._kept
        unknown = [t for t in topics if t not in kept or kept[t][1] <= now]
        if unknown:
            answered = await write_verdicts(client, unknown)
            for topic in unknown:
                kept[topic] = (answered.get(topic, True), now + VERDICT_TTL_S)
        return frozenset(t for t in topics if not kept[t][0])
