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

The command queue is :class:`OwnerCommands`, shared with the group source
(:mod:`consumer.kafka.confluent_adapter.source_owner`, which has its own loop around ``consume``).
Commands wait at most one consume slice (:attr:`ConsumerThread.slice_s`) for the thread;
while :attr:`ConsumerThread.consuming` is False the thread only waits for commands, so a
burst of set-up calls (metadata, offsets) answers at once. What it consumed waits in a buffer
of at most ``max_buffered`` messages; with the buffer full the thread still calls
``consume`` every ``keepalive_s`` (librdkafka enforces ``max.poll.interval.ms`` on the client and
serves rebalances only there), so a paused reader stays in its group.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Message

from consumer.cpu.threads import name_os_thread
from consumer.kafka.confluent_adapter.errors import SECURITY_CODES, connect_failure, kafka_error
from consumer.kafka.confluent_adapter.logs import librdkafka_logger
from consumer.kafka.errors import KafkaUnavailableError
from consumer.kafka.records import TopicPartition

__all__ = ["WAKE", "Chunk", "ConsumerThread", "OwnerCommands", "resolve"]

log = logging.getLogger(__name__)

T = TypeVar("T")


WAKE: Final = object()
"""Queued to wake an owner thread waiting for commands (a stop, a finished handler)."""


class OwnerCommands:
    """The command queue from the asyncio loop to the one thread that owns a ``Consumer``
    (:class:`ConsumerThread`, :class:`~consumer.kafka.confluent_adapter.source_owner.SourceOwner`).

    Loop side: :meth:`call` (a future for ``fn()``'s result or exception), :meth:`send` (no
    answer; an exception is logged), :meth:`wake`. Owner side: :meth:`serve` runs what is
    queued, :meth:`await_on_loop` runs a coroutine on the loop and serves commands until it is
    done (inside a rebalance callback: the handler commits through :meth:`call`), :meth:`end`
    answers everything still queued, and later calls at once, with their ``closed`` value.

    Args:
        name: the owner's name, in log lines.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        """The loop that answers: set before the first command."""
        self._queue: queue.SimpleQueue[_Command | object] = queue.SimpleQueue()
        self._lock = threading.Lock()  # ended and the queue's last puts
        self._ended = False

    # -- loop side -----------------------------------------------------------------------------

    def call(self, fn: Callable[[], T], closed: T | BaseException) -> asyncio.Future[T]:
        """Run ``fn()`` on the owner thread; its result or exception on the loop. ``closed``:
        the result (or the exception raised) once the owner has ended."""
        loop = self.loop or asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()

        def answer(result: Any, error: BaseException | None) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed
                loop.call_soon_threadsafe(resolve, fut, result, error)

        def run() -> None:
            try:
                result = fn()
            except BaseException as err:  # handed to the caller
                answer(None, err)
            else:
                answer(result, None)

        def cancel() -> None:
            answer(*((None, closed) if isinstance(closed, BaseException) else (closed, None)))

        if not self._put(_Command(run, cancel)):
            cancel()
        return fut

    def send(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` on the owner thread, not waiting for it (an exception is logged;
        dropped once the owner has ended)."""
        self._put(_Command(_logged(fn), _nothing))

    def wake(self) -> None:
        """Make a :meth:`serve` that waits return."""
        self._queue.put(WAKE)

    def _put(self, command: _Command) -> bool:
        with self._lock:
            if self._ended:
                return False
            self._queue.put(command)
            return True

    # -- owner side ----------------------------------------------------------------------------

    def serve(self, wait_s: float | None = 0.0) -> None:
        """Run the queued commands, waiting up to ``wait_s`` seconds for the first (None: until
        one comes or :meth:`wake`; 0: not at all)."""
        try:
            item = self._queue.get_nowait() if wait_s == 0 else self._queue.get(timeout=wait_s)
        except queue.Empty:
            return
        while True:
            if isinstance(item, _Command):
                item.run()
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return

    def await_on_loop(self, coro: Coroutine[Any, Any, object]) -> None:
        """Run ``coro`` as a task on the loop and return once it is done, serving commands
        meanwhile (never ``consume``). Its exception is logged, not raised; returns at once
        when the loop has closed."""
        loop = self.loop
        assert loop is not None
        try:
            fut = asyncio.run_coroutine_threadsafe(coro, loop)
        except RuntimeError:  # the loop is closed
            coro.close()
            return

        def finished(done: concurrent.futures.Future[object]) -> None:
            if not done.cancelled() and done.exception() is not None:
                log.error("%s: handler failed", self.name, exc_info=done.exception())
            self.wake()

        fut.add_done_callback(finished)
        while not fut.done() and not loop.is_closed():
            self.serve(_AWAIT_SLICE_S)
        self.serve()

    def end(self) -> None:
        """No more commands: answer what is queued, and every later one at once, as closed."""
        with self._lock:
            self._ended = True
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Command):
                item.cancel()


_AWAIT_SLICE_S: Final = 0.1
"""How often :meth:`OwnerCommands.await_on_loop` looks whether the loop has closed (seconds;
a finished handler wakes it at once)."""


class _Command:
    """A call for the owner thread: ``run`` there, or ``cancel`` once it has ended."""

    __slots__ = ("cancel", "run")

    def __init__(self, run: Callable[[], None], cancel: Callable[[], None]) -> None:
        self.run = run
        self.cancel = cancel


def _logged(command: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        try:
            command()
        except Exception:
            log.exception("Kafka client command failed")

    return run


def _nothing() -> None:
    pass


def resolve(fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """Settle ``fut`` (on its loop) unless it is settled already."""
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


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
        self._commands = OwnerCommands(name)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._chunks: deque[Chunk] = deque()
        self._arrived: asyncio.Event | None = None
        self._delivered = 0  # written by the thread only
        self._taken = 0  # written by the loop only
        self._closed = False
        self._closing: asyncio.Future[None] | None = None  # asked; done between two consumes

    # -- loop side -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the thread; the running loop is the one it answers (idempotent)."""
        if self._thread is not None:
            return
        self._loop = self._commands.loop = asyncio.get_running_loop()
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
        closed = KafkaUnavailableError(f"{self._name}: the consumer is closed")
        if not self.alive:
            raise closed
        return await self._commands.call(lambda: fn(self._consumer), closed)

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
        closed: asyncio.Future[None] = self._loop.create_future()

        def ask() -> bool:  # inside a callback too: the thread closes once it has returned
            self._closing = closed
            return True

        try:
            if await self._commands.call(ask, False):
                await closed
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

        async def run() -> None:
            await fn()

        self._commands.await_on_loop(run())

    # -- the thread ------------------------------------------------------------------------------

    def _on_error(self, err: KafkaError) -> None:
        self.errors.append(err)
        log.debug("%s: librdkafka error %s: %s", self._name, err.name(), err.str())

    def _close(self, fut: asyncio.Future[None]) -> None:
        try:
            self._consumer.close()
        except BaseException as err:
            self.to_loop(resolve, fut, None, err)
        else:
            self.to_loop(resolve, fut, None, None)

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
        name_os_thread(self._name)  # "kbatch-job …", "kbatch-backfill …" (consumer.cpu.threads)
        last_consume = time.monotonic()
        try:
            while True:
                wants = self._wants_consume(last_consume)
                self._commands.serve(0 if wants else self.slice_s)
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
            self._closed = True
            self._commands.end()
            if self._closing is not None:  # asked, then consume failed: closed all the same
                self.to_loop(resolve, self._closing, None, None)
            if self.failure is not None and self._arrived is not None:
                self.to_loop(self._arrived.set)  # wakes a take() waiting
