"""Which records of an input partition are started, which are held: the delivery gate.

:class:`IntervalGate` (pure, no I/O) is what :class:`consumer.finish.delivery.Delivery` holds
records with, per input partition:

* a record is *started* when delivery begins sending its reply or dead letter, and *finished*
  when its offset is finished in the tracker or given up (every send of it answered);
* :meth:`IntervalGate.close` (a commit under ``--exactly-once``, or a revoke in both modes
  begins): new records of the partition are *held*, not started; the started ones run to their
  end, second sends included (a dead letter's error reply), so none is cut in half;
* once no record of the partition is started, the tracker's committable offset and the
  offsets finished above it (kb1 commit metadata) name exactly the records whose sends are in
  its open transaction: every started record finished, none was started after the close;
* :meth:`IntervalGate.reopen` (the commit ended, or the partition stays after a revoke): the
  held records start; :meth:`IntervalGate.drop` (the partition moved): they never do.

Who closes a partition reopens it: :meth:`IntervalGate.close` returns what it closed, so a
commit inside a revoke leaves the revoke's hold alone (:meth:`Delivery.holding`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Generic, TypeVar

from consumer.kafka.records import TopicPartition

__all__ = ["IntervalGate"]

T = TypeVar("T")


class IntervalGate(Generic[T]):
    """Per input partition: records started in its open transaction, records held while it
    commits (``T``: what the owner needs to start a held record later). Loop thread only."""

    def __init__(self) -> None:
        self._started: dict[TopicPartition, int] = {}
        self._closed: set[TopicPartition] = set()
        self._held: dict[TopicPartition, list[T]] = {}
        self._changed = asyncio.Event()

    def admit(self, tp: TopicPartition, item: T) -> bool:
        """True: ``item`` starts now (counted until :meth:`finished`); False: ``tp`` is
        committing and ``item`` is held until :meth:`reopen`."""
        if tp in self._closed:
            self._held.setdefault(tp, []).append(item)
            return False
        self._started[tp] = self._started.get(tp, 0) + 1
        return True

    def finished(self, tp: TopicPartition) -> None:
        """A started record of ``tp`` needs nothing more from delivery."""
        left = self._started.get(tp, 0) - 1
        if left > 0:
            self._started[tp] = left
            return
        self._started.pop(tp, None)
        if tp in self._closed:
            self._changed.set()

    def started(self, tp: TopicPartition) -> int:
        """Records of ``tp`` started and not finished."""
        return self._started.get(tp, 0)

    def close(self, tps: Iterable[TopicPartition]) -> frozenset[TopicPartition]:
        """Hold new records of ``tps`` from now on; returns those of ``tps`` not held before
        (what the caller closed, and so reopens)."""
        closed = frozenset(tps) - self._closed
        self._closed |= closed
        return closed

    async def quiet(
        self, tps: frozenset[TopicPartition], timeout_s: float
    ) -> frozenset[TopicPartition]:
        """Wait up to ``timeout_s`` seconds until no record of ``tps`` (closed) is started;
        returns those of ``tps`` that are quiet then."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + timeout_s
        while any(tp in self._started for tp in tps) and loop.time() < give_up:
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), give_up - loop.time())
        return frozenset(tp for tp in tps if tp not in self._started)

    def drop(self, tps: Iterable[TopicPartition]) -> list[T]:
        """Start records of ``tps`` again; returns the held ones, in order, never started
        (the partition moved to another member: they are not sent)."""
        out: list[T] = []
        for tp in tps:
            self._closed.discard(tp)
            out.extend(self._held.pop(tp, []))
        return out

    def reopen(self, tps: Iterable[TopicPartition]) -> list[T]:
        """Start records of ``tps`` again; returns the held ones, in order, now started."""
        out: list[T] = []
        for tp in tps:
            self._closed.discard(tp)
            held = self._held.pop(tp, [])
            if held:
                self._started[tp] = self._started.get(tp, 0) + len(held)
                out.extend(held)
        return out
