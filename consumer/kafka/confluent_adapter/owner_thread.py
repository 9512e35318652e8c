"""One daemon thread owns a confluent-kafka ``Consumer``; the asyncio loop talks to it by
commands and receives what it consumed in chunks.

A ``Consumer`` is not thread-safe (a call from another thread waits behind ``consume`` on a
reentrancy gate), and librdkafka runs the rebalance, error and log callbacks only inside
``poll``/``consume``/``close``, on the thread that calls them. So one thread makes every call::

    asyncio loop                                owner thread
    await call(fn)   ── command queue ──►       fn(consumer), between two consume() calls
        future      ◄── call_soon_threadsafe ── its result or exception
    await take(n)   ◄── call_soon_threadsafe ── one Chunk per consume() that returned messages
    a handler task  ◄── call_soon_threadsafe ── a rebalance callback (await_on_loop): the
                                                thread serves commands until the task is done

Commands wait at most one consume slice (:attr:`ConsumerThread.slice_s`) for the thread;
while :attr:`ConsumerThread.consuming` is False the thread only waits for commands, so a
burst of set-up calls (metadata, offsets) answers at once. What it consumed waits in a buffer
of at most ``max_buffered`` messages; with the buffer full the thread still calls
``consume`` every ``keepalive_s`` (librdkafka enforces ``max.poll.interval.ms`` on the client and
serves rebalances only there), so a paused reader stays in its group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Message

from consumer.kafka.confluent_adapter.errors import SECURITY_CODES, connect_failure, kafka_error
from consumer.kafka.confluent_adapter.logs import librdkafka_logger
from consumer.kafka.errors import KafkaUnavailableError
from consumer.kafka.records import TopicPartition

__all__ = ["Chunk", "ConsumerThread"]

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(slots=True)
class Chunk:
    """What one or more ``consume`` calls returned, in order.

    Attributes:
        messages: the messages (an error event, e.g. ``_PARTITION_EOF``, is a message too).
        positions: ``(topic, partition)`` → the consumer's position (the next offset it hands
            out; it moves past transaction markers) of each assigned partition right after the
            last of these messages; empty when the chunk was split (its positions belong to
            the messages not yet taken).
    """

    messages: list[Message]
    positions: dict[TopicPartition, int] = field(default_factory=dict)


class _Close:
    """The command that closes the consumer and ends the thread."""


_Command = tuple[Callable[[Consumer], Any] | _Close, "asyncio.Future[Any]"]


class ConsumerThread:
    """A ``Consumer`` and the daemon thread that makes every call to it.

    Args:
        config: librdkafka properties (and confluent-kafka's callables). ``error_cb`` and
            ``logger`` are set here: errors are kept in :attr:`errors` (the last 32) and
            logged at DEBUG; librdkafka's log lines go to the ``kbatch.librdkafka.range`` logger.
        name: the thread's name.
        max_chunk: most messages one ``consume`` call returns.
        max_buffered: most messages handed to the loop and not yet taken before the thread
            stops consuming (except every ``keepalive_s``).
        slice_s: how long one ``consume`` call waits (seconds): the longest a command waits.
        keepalive_s: the longest the thread goes without ``consume`` while consuming (seconds).
        positions: whether each chunk carries the assigned partitions' positions.

    Raises:
        confluent_kafka.KafkaException: an invalid configuration.
    """

    def __init__(
        self,
        config: Mapping[str, object],
        *,
        name: str,
        max_chunk: int = 500,
        max_buffered: int = 2000,
        slice_s: float = 0.05,
        keepalive_s: float = 1.0,
        positions: bool = True,
    ) -> None:
        self.errors: deque[KafkaError] = deque(maxlen=32)
        self.failure: BaseException | None = None
        """What ended the thread other than :meth:`close` (None while it runs)."""
        self.consuming = False
        """Set by the loop: the thread calls ``consume`` between commands (an assignment or
        a subscription exists)."""
        self.slice_s = slice_s
        self._max_chunk = max_chunk
        self._max_buffered = max_buffered
        self._keepalive_s = keepalive_s
        self._positions = positions
        self._consumer = Consumer(
            {
                **config,
                "error_cb": self._on_error,
                "logger": librdkafka_logger("range"),
            }
        )
        self._name = name
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._chunks: deque[Chunk] = deque()
        self._arrived: asyncio.Event | None = None
        self._delivered = 0  # written by the thread only
        self._taken = 0  # written by the loop only
        self._closed = False
        self._lock = threading.Lock()  # closed and the queue, for call()
        self._closing: asyncio.Future[Any] | None = None  # a close asked while in a callback

    # -- loop side -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the thread; the running loop is the one it answers (idempotent)."""
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._arrived = asyncio.Event()
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Started and not closed."""
        return self._thread is not None and not self._closed

    async def call(self, fn: Callable[[Consumer], T]) -> T:
        """``fn(consumer)`` run on the owner thread between two ``consume`` calls; its result.

        Raises:
            KafkaUnavailableError: the thread is not running (not started, or closed).
            BaseException: what ``fn`` raised (``KafkaException`` unmapped: callers map it).
        """
        with self._lock:
            if not self.alive:
                raise KafkaUnavailableError(f"{self._name}: the consumer is closed")
            assert self._loop is not None
            fut: asyncio.Future[T] = self._loop.create_future()
            self._commands.put((fn, fut))
        return await fut

    async def connect(self, context: str, timeout_s: float) -> None:
        """Wait until a broker answers a metadata request (librdkafka connects lazily, and
        reports a refused TLS check or login only to ``error_cb``).

        Raises:
            KafkaSecurityError: a TLS check or the SASL login failed
                (:func:`~consumer.kafka.confluent_adapter.errors.connect_failure`).
            KafkaUnavailableError: ``f"{context}: <librdkafka's text>"``: every broker is down,
                or none answered within ``timeout_s``.
        """

        def attempt(consumer: Consumer) -> None:
            deadline = time.monotonic() + timeout_s
            self.errors.clear()
            while True:
                try:
                    consumer.list_topics(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
                    return
                except KafkaException as exc:
                    last = kafka_error(exc)
                consumer.poll(0.05)  # serves error_cb: no assignment yet, so no message
                seen = list(self.errors)
                denied = any(e.code() in SECURITY_CODES for e in seen)
                down = any(e.code() == KafkaError._ALL_BROKERS_DOWN for e in seen)
                if denied or down or time.monotonic() >= deadline:
                    raise connect_failure(seen or ([last] if last is not None else []), context)

        await self.call(attempt)

    async def take(self, max_messages: int, timeout_s: float) -> Chunk:
        """At most ``max_messages`` buffered messages, in the order consumed; waits at most
        ``timeout_s`` for the first (empty chunk when none came).

        Raises:
            KafkaUnavailableError: the buffer is empty and the thread failed (an exception
                out of ``consume``, e.g. one raised by a rebalance callback).
        """
        assert self._arrived is not None
        if not self._chunks and self.failure is not None:
            raise KafkaUnavailableError(f"{self._name}: the consumer failed: {self.failure!r}")
        if not self._chunks and timeout_s > 0 and self.alive:
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), timeout_s)
            if not self._chunks and self.failure is not None:
                raise KafkaUnavailableError(f"{self._name}: the consumer failed: {self.failure!r}")
        out = Chunk([])
        while self._chunks and len(out.messages) < max_messages:
            head = self._chunks[0]
            room = max_messages - len(out.messages)
            if len(head.messages) <= room:
                self._chunks.popleft()
                out.messages.extend(head.messages)
                out.positions.update(head.positions)
            else:
                out.messages.extend(head.messages[:room])
                del head.messages[:room]
                out.positions = {}  # belong to the messages left
        self._taken += len(out.messages)
        return out

    def discard(self, tps: set[TopicPartition]) -> None:
        """Drop the buffered messages and positions of ``tps`` (read again after a seek; call it
        once the seek's command answered: every chunk consumed before it is here by then)."""
        kept: deque[Chunk] = deque()
        dropped = 0
        for chunk in self._chunks:
            before = len(chunk.messages)
            chunk.messages = [m for m in chunk.messages if (m.topic(), m.partition()) not in tps]
            dropped += before - len(chunk.messages)
            for tp in tps:
                chunk.positions.pop(tp, None)
            if chunk.messages:
                kept.append(chunk)
        self._chunks = kept
        self._taken += dropped

    async def close(self) -> None:
        """Close the consumer on its thread (``close()`` runs the revoke callback of a group
        member there) and end the thread; idempotent."""
        if not self.alive:
            return
        assert self._loop is not None
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._commands.put((_Close(), fut))
        try:
            await fut
        finally:
            self._closed = True

    # -- owner-thread side (callbacks run here, inside consume) ---------------------------------

    def to_loop(self, fn: Callable[..., object], *args: object) -> None:
        """Run ``fn(*args)`` on the loop soon (from the owner thread; dropped when the loop has
        closed)."""
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop closed
            log.debug("%s: loop closed; %r dropped", self._name, fn)

    def await_on_loop(self, fn: Callable[[], Awaitable[object]]) -> None:
        """Run ``fn()`` as a task on the loop and return when it is done, serving commands
        meanwhile (from the owner thread, e.g. inside a rebalance callback: the handler may
        commit through :meth:`call`). Its exception is logged, not raised; returns at once
        when the loop has closed."""
        loop = self._loop
        assert loop is not None
        done = threading.Event()

        def finished(task: asyncio.Future[object]) -> None:
            if not task.cancelled() and task.exception() is not None:
                log.error("%s: handler failed", self._name, exc_info=task.exception())
            done.set()

        def begin() -> None:
            asyncio.ensure_future(fn()).add_done_callback(finished)

        try:
            loop.call_soon_threadsafe(begin)
        except RuntimeError:
            return
        while not done.is_set() and not loop.is_closed():
            self._serve(block=True, nested=True)

    # -- the thread ------------------------------------------------------------------------------

    def _on_error(self, err: KafkaError) -> None:
        self.errors.append(err)
        log.debug("%s: librdkafka error %s: %s", self._name, err.name(), err.str())

    def _answer(self, fut: asyncio.Future[Any], result: object, exc: BaseException | None) -> None:
        def settle() -> None:
            if fut.done():
                return
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(result)

        self.to_loop(settle)

    def _serve(self, *, block: bool, nested: bool = False) -> bool:
        """Run the queued commands (waiting up to one slice for the first when ``block``);
        False once the close command ran."""
        try:
            item = (
                self._commands.get(timeout=self.slice_s) if block else self._commands.get_nowait()
            )
        except queue.Empty:
            return True
        while True:
            fn, fut = item
            if isinstance(fn, _Close):
                if nested:  # inside a callback: close once it returned
                    self._closing = fut
                else:
                    self._close(fut)
                    return False
            else:
                try:
                    result = fn(self._consumer)
                except BaseException as err:  # handed to the caller
                    self._answer(fut, None, err)
                else:
                    self._answer(fut, result, None)
            try:
                item = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _close(self, fut: asyncio.Future[Any]) -> None:
        try:
            self._consumer.close()
        except BaseException as err:
            self._answer(fut, None, err)
        else:
            self._answer(fut, None, None)

    def _wants_consume(self, last_consume: float) -> bool:
        if not self.consuming:
            return False
        if self._delivered - self._taken < self._max_buffered:
            return True
        return time.monotonic() - last_consume >= self._keepalive_s

    def _consume_once(self) -> None:
        messages = self._consumer.consume(self._max_chunk, self.slice_s)
        if not messages:
            return
        positions: dict[TopicPartition, int] = {}
        if self._positions:
            for tp in self._consumer.position(self._consumer.assignment()):
                if tp.offset >= 0:
                    positions[(tp.topic, tp.partition)] = tp.offset
        self._delivered += len(messages)
        self.to_loop(self._arrive, Chunk(messages, positions))

    def _arrive(self, chunk: Chunk) -> None:
        self._chunks.append(chunk)
        assert self._arrived is not None
        self._arrived.set()

    def _run(self) -> None:
        last_consume = time.monotonic()
        try:
            while True:
                wants = self._wants_consume(last_consume)
                if not self._serve(block=not wants):
                    return
                if self._closing is not None:
                    self._close(self._closing)
                    return
                if self._wants_consume(last_consume):
                    self._consume_once()
                    last_consume = time.monotonic()
        except BaseException as err:
            log.exception("%s: the consumer thread failed", self._name)
            self.failure = err
            with contextlib.suppress(Exception):
                self._consumer.close()
        finally:
            with self._lock:
                self._closed = True
            self._fail_pending()
            if self.failure is not None and self._arrived is not None:
                self.to_loop(self._arrived.set)  # wakes a take() waiting

    def _fail_pending(self) -> None:
        while True:
            try:
                _, fut = self._commands.get_nowait()
            except queue.Empty:
                return
            self._answer(fut, None, KafkaUnavailableError(f"{self._name}: the consumer is closed"))
