"""Write verdicts through librdkafka's admin client: whether this principal may write a topic,
asked before a record enters a transaction (why: :mod:`consumer.kafka.topic_operations`; a
topic refused at ``AddPartitionsToTxn`` makes librdkafka's whole transaction abortable).

``describe_topics(..., include_authorized_operations=True)`` (KIP-430) answers, per topic, the
operations the principal may perform; WRITE missing, or the topic hidden
(``TOPIC_AUTHORIZATION_FAILED``), is a denial. No answer (a missing topic, a broker without an
authorizer, one that does not answer) is no verdict: the record is sent as before.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AclOperation, AdminClient  # type: ignore[attr-defined]  # public, not in __all__

from consumer.kafka.config import KafkaClientSettings
from consumer.kafka.confluent_adapter.client_config import client_config
from consumer.kafka.confluent_adapter.logs import librdkafka_logger
from consumer.kafka.sink_timing import VERDICT_TTL_S

__all__ = ["AdminWriteVerdicts"]

REQUEST_TIMEOUT_S: Final = 5.0
"""At most this long for one describe request (then: no verdict)."""

_WRITERS: Final = frozenset({AclOperation.WRITE, AclOperation.ALL})


class AdminWriteVerdicts:
    """Write verdicts kept :data:`~consumer.kafka.sink_timing.VERDICT_TTL_S` seconds per
    topic, shared by the producers of one transactional sink; a topic without a verdict counts
    as writable for as long. Loop thread only; the admin client is made at the first ask.

    Args:
        client: the brokers and security.
    """

    def __init__(self, client: KafkaClientSettings) -> None:
        self._client = client
        self._admin: AdminClient | None = None
        self._kept: dict[str, tuple[bool, float]] = {}  # topic → (writable, expiry loop time)

    async def denied(self, topics: set[str]) -> frozenset[str]:
        """Those of ``topics`` this principal may not write (asking the broker about the ones
        without a kept verdict)."""
        now = asyncio.get_running_loop().time()
        kept = self._kept
        unknown = [t for t in topics if t not in kept or kept[t][1] <= now]
        if unknown:
            answered = await self._ask(unknown)
            for topic in unknown:
                kept[topic] = (answered.get(topic, True), now + VERDICT_TTL_S)
        return frozenset(t for t in topics if not kept[t][0])

    async def _ask(self, topics: list[str]) -> dict[str, bool]:
        if self._admin is None:
            config: dict[str, Any] = {
                **client_config(self._client),
                "logger": librdkafka_logger("verdicts"),
            }
            self._admin = AdminClient(config)
        try:
            futures = self._admin.describe_topics(
                TopicCollection(topics),
                include_authorized_operations=True,
                request_timeout=REQUEST_TIMEOUT_S,
            )
        except KafkaException:
            return {}
        verdicts: dict[str, bool] = {}
        for topic, future in futures.items():
            try:
                description = await asyncio.wrap_future(future)
            except KafkaException as err:
                code = err.args[0].code() if err.args else None
                if code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                    verdicts[topic] = False
                continue
            operations = description.authorized_operations
            if operations:  # None or empty: the broker did not say
                verdicts[topic] = bool(_WRITERS.intersection(operations))
        return verdicts
