"""A constant request load and a live reply reader, on their own event loop, feeding a
:class:`~tests.chaos.history.History`; plus the final reads that close the history.

The loop runs in a daemon thread, so a test may block its own (``poll_until``) while the load
keeps its rate through faults. Requests are produced with ``acks=all`` and idempotence (a
retried send is not a second request); their keys are ``<prefix>-<n>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from concurrent.futures import Future
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from tests.chaos.history import History, ReplyAt
from tests.integration.harness import poll_until, request

REQUEST_TIMEOUT_MS = 30_000


class Workload:
    """``rate_per_s`` requests per second to ``request_topic`` and a live reader of
    ``reply_topic`` (``read_committed`` when ``read_committed``), recorded in :attr:`history`.

    Use :meth:`start`, then :meth:`stop_producing` and :meth:`wait_seen`, then :meth:`stop`.
    """

    def __init__(
        self,
        bootstrap: str,
        request_topic: str,
        reply_topic: str,
        *,
        rate_per_s: float = 40.0,
        prefix: str = "r",
        read_committed: bool = False,
    ) -> None:
        self.bootstrap = bootstrap
        self.request_topic = request_topic
        self.reply_topic = reply_topic
        self.rate_per_s = rate_per_s
        self.prefix = prefix
        self.read_committed = read_committed
        self.history = History()
        self.sent = 0
        self.failed_sends = 0
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._producing: Future[None] | None = None
        self._reading: Future[None] | None = None
        self._stop_producing = threading.Event()
        self._stop_reading = threading.Event()

    def start(self) -> Workload:
        self._thread.start()
        self._reading = asyncio.run_coroutine_threadsafe(self._read(), self._loop)
        self._producing = asyncio.run_coroutine_threadsafe(self._produce(), self._loop)
        return self

    def stop_producing(self, timeout_s: float = 60) -> int:
        """Stop sending; wait for the outstanding acknowledgements. Returns requests acked."""
        self._stop_producing.set()
        if self._producing is not None:
            self._producing.result(timeout_s)
        return self.acked_count()

    def acked_count(self) -> int:
        with self._lock:
            return len(self.history.acked_at)

    def unanswered(self) -> set[bytes]:
        """Acknowledged requests the live reader has not seen a reply to yet."""
        with self._lock:
            return set(self.history.acked_at) - set(self.history.first_seen_at)

    def seen_count(self) -> int:
        with self._lock:
            return len(self.history.first_seen_at)

    def wait_seen(self, timeout_s: float) -> float:
        """Poll until every acknowledged request has a reply seen live; the seconds it took."""
        started = time.monotonic()
        poll_until(
            lambda: not self.unanswered(),
            timeout_s,
            f"replies to every acknowledged request ({len(self.unanswered())} missing)",
            every_s=0.2,
        )
        return time.monotonic() - started

    def stop(self) -> None:
        self._stop_producing.set()
        self._stop_reading.set()
        for future in (self._producing, self._reading):
            if future is not None:
                # cleanup: the test already has its verdict
                with contextlib.suppress(Exception):
                    future.result(60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _produce(self) -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            acks="all",
            enable_idempotence=True,
            linger_ms=5,
            request_timeout_ms=REQUEST_TIMEOUT_MS,
        )
        await producer.start()
        pending: set[asyncio.Future[Any]] = set()
        try:
            started = time.monotonic()
            while not self._stop_producing.is_set():
                key = f"{self.prefix}-{self.sent}".encode()
                record = request(key, f"chaos request {self.sent} " + "w " * (self.sent % 17))
                self.sent += 1
                try:  # during a long cut the buffer fills: send() itself times out
                    ack = await producer.send(self.request_topic, record.value, key=key)
                except KafkaError:
                    self.failed_sends += 1  # never acknowledged: may or may not be written
                else:
                    ack.add_done_callback(lambda f, k=key: self._on_ack(k, f))
                    pending.add(ack)
                    ack.add_done_callback(pending.discard)
                next_at = started + self.sent / self.rate_per_s
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            if pending:
                await asyncio.wait(pending, timeout=REQUEST_TIMEOUT_MS / 1000 + 5)
        finally:
            await producer.stop()

    def _on_ack(self, key: bytes, ack: asyncio.Future[Any]) -> None:
        if ack.cancelled() or ack.exception() is not None:
            self.failed_sends += 1
            return
        with self._lock:
            self.history.acked(key, time.monotonic())

    async def _read(self) -> None:
        consumer = AIOKafkaConsumer(
            self.reply_topic,
            bootstrap_servers=self.bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            isolation_level="read_committed" if self.read_committed else "read_uncommitted",
        )
        await consumer.start()
        try:
            while not self._stop_reading.is_set():
                batches = await consumer.getmany(timeout_ms=200)
                now = time.monotonic()
                with self._lock:
                    for records in batches.values():
                        for r in records:
                            self.history.seen(r.key, r.partition, r.offset, now)
        finally:
            await consumer.stop()


async def read_places(
    bootstrap: str, topic: str, partitions: int, *, read_committed: bool, timeout_s: float = 60
) -> list[tuple[bytes, int, int]]:
    """(key, partition, offset) of every record of ``topic``'s ``partitions`` now, read to each
    partition's end (the last stable offset under ``read_committed``) taken at start."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        isolation_level="read_committed" if read_committed else "read_uncommitted",
    )
    await consumer.start()
    out: list[tuple[bytes, int, int]] = []
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout_s
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            assert time.monotonic() < deadline, f"{topic} not read to {ends} in {timeout_s} s"
            for records in (await consumer.getmany(timeout_ms=200)).values():
                out.extend((r.key or b"", r.partition, r.offset) for r in records)
    finally:
        await consumer.stop()
    return out


async def close_history(
    history: History, bootstrap: str, reply_topic: str, partitions: int
) -> None:
    """The final reads: every committed reply, and the places only an uncommitted reader sees
    (aborted transactions' records). Call once kbatch stopped and its transactions ended."""
    committed = await read_places(bootstrap, reply_topic, partitions, read_committed=True)
    everything = await read_places(bootstrap, reply_topic, partitions, read_committed=False)
    history.final(committed)
    committed_at: set[ReplyAt] = {(p, o) for _k, p, o in committed}
    history.aborted((p, o) for _k, p, o in everything if (p, o) not in committed_at)
