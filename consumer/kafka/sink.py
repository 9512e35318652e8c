"""The reply sink: one idempotent producer (acks=all) for replies and dead letters.

Every send attempt has a deadline (``send_timeout_ms``); a retriable failure (broker down,
leader moving, timeout) is retried with exponential backoff until the sink closes, so a broker
restart delays replies but loses none. A non-retriable failure (an invalid topic or partition
named by the client) raises :class:`DeliveryError` and the owner dead-letters the request.
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, KafkaTimeoutError
from tenacity import AsyncRetrying, retry_if_exception, wait_exponential

from consumer.config import ServeSettings
from consumer.kafka.admin import KafkaUnavailableError
from consumer.kafka.client_config import security_kwargs
from schemas.records import OutRecord

log = logging.getLogger(__name__)


class DeliveryError(RuntimeError):
    """A record cannot be delivered whatever the retries (not retriable)."""


class SinkClosedError(RuntimeError):
    """The sink was closed while a send was still being retried."""


def _retriable(err: BaseException) -> bool:
    if isinstance(err, TimeoutError | KafkaTimeoutError):
        return True
    return isinstance(err, KafkaError) and bool(getattr(err, "retriable", False))


class KafkaSink:
    """Sends :class:`schemas.records.OutRecord` values; ``topic=None`` means the reply topic."""

    def __init__(self, settings: ServeSettings) -> None:
        self._default_topic = settings.reply_topic
        self._attempt_timeout_s = settings.send_timeout_ms / 1000
        self._closed = False
        self._producer = AIOKafkaProducer(
            bootstrap_servers=settings.bootstrap,
            client_id="kbatch-sink",
            acks="all",
            enable_idempotence=True,
            linger_ms=2,
            # aiokafka's 16 KiB default holds ~8 replies: with idempotence (one request in
            # flight per partition) that caps a partition's replies per round trip.
            max_batch_size=256 * 1024,
            request_timeout_ms=settings.send_timeout_ms,
            **security_kwargs(settings),
        )

    async def start(self) -> None:
        """Connect the producer.

        Raises:
            KafkaUnavailableError: no broker answered.
        """
        try:
            await self._producer.start()
        except KafkaError as err:
            await self._producer.stop()
            raise KafkaUnavailableError(f"the reply producer cannot connect: {err}") from err

    async def stop(self) -> None:
        """Flush what is buffered and close; sends still retrying give up (idempotent)."""
        self._closed = True
        await self._producer.stop()

    async def send(self, record: OutRecord) -> None:
        """Send one record and return once the broker acknowledged it.

        Raises:
            DeliveryError: the record can never be delivered (bad topic, partition, size).
            SinkClosedError: the sink closed before the record was acknowledged.
        """
        try:
            try:
                await self._send_once(record)  # the fast path: no retry machinery per record
            except Exception as first:
                if not _retriable(first) or self._closed:
                    raise
                log.warning(
                    "send to %s failed (%s); retrying", record.topic or self._default_topic, first
                )
                await self._retry(record)
        except DeliveryError:
            raise
        except Exception as err:
            if self._closed:
                raise SinkClosedError(str(err)) from err
            raise DeliveryError(f"{type(err).__name__}: {err}") from err

    async def _retry(self, record: OutRecord) -> None:
        retrying = AsyncRetrying(
            retry=retry_if_exception(lambda e: _retriable(e) and not self._closed),
            wait=wait_exponential(multiplier=0.05, max=2.0),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                await self._send_once(record)

    async def _send_once(self, record: OutRecord) -> None:
        topic = record.topic or self._default_topic
        async with asyncio.timeout(self._attempt_timeout_s):
            try:
                future = await self._producer.send(
                    topic,
                    value=record.value,
                    key=record.key,
                    partition=record.partition,
                    headers=list(record.headers),
                )
            except (AssertionError, ValueError, TypeError) as err:
                raise DeliveryError(f"cannot send to {topic}[{record.partition}]: {err}") from err
            await future
