"""Test doubles shared by the unit tests: one sink for serve and backfill, the sources, the
engines. No broker, no model; each fake records what it was asked."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Protocol

from consumer.batching.routes import OutcomeCallback
from consumer.batching.types import InferenceItem, ItemOutcome
from consumer.kafka.errors import DeliveryError, TransactionError
from consumer.kafka.ranges import PartitionRange, plan_partition
from consumer.kafka.records import InRecord, Membership, TopicPartition
from schemas.records import OutRecord


class FakeSink:
    """:class:`consumer.kafka.sink.KafkaSink`'s one send path, in memory.

    Args:
        auto_ack: acknowledge every record on the next loop turn; else each ack is a future
            the test resolves (``acks[i].set_result(None)`` or ``set_exception(...)``) in the
            order it likes.
        refuse: topics whose records fail with :class:`DeliveryError` (auto_ack only); refused
            records are not in ``sent``.
    """

    def __init__(self, *, auto_ack: bool = False, refuse: frozenset[str] = frozenset()) -> None:
        self.sent: list[OutRecord] = []
        self.acks: list[asyncio.Future[None]] = []
        self.calls = 0  # send calls
        self.auto_ack = auto_ack
        self.refuse = refuse

    async def send(self, records: Sequence[OutRecord]) -> list[asyncio.Future[None]]:
        self.calls += 1
        loop = asyncio.get_running_loop()
        acks = [loop.create_future() for _ in records]
        if not self.auto_ack:
            self.sent.extend(records)
            self.acks.extend(acks)
            return acks
        await asyncio.sleep(0)
        for record, ack in zip(records, acks, strict=True):
            if record.topic in self.refuse:
                ack.set_exception(DeliveryError(f"{record.topic} refused"))
            else:
                self.sent.append(record)
                ack.set_result(None)
        return acks

    def to(self, topic: str) -> list[OutRecord]:
        return [r for r in self.sent if r.topic == topic]


class FakeTransactions:
    """:class:`consumer.kafka.transactions.TransactionalSink` in memory: each input
    partition's sends go to its own :class:`FakeSink` (``sinks[tp]``, acks resolved by the
    test); ``commits`` lists each commit's (offsets, metadata); ``fail`` makes every commit of
    those partitions raise :class:`TransactionError` (with ``reason`` as each one's
    ``failed`` reason when set) and close them, as the real one does; ``broken`` partitions'
    producers failed: ``close_failed`` closes them."""

    def __init__(self) -> None:
        self.sinks: dict[TopicPartition, FakeSink] = {}
        self.commits: list[tuple[dict[TopicPartition, int], dict[TopicPartition, str]]] = []
        self.events: list[tuple[str, TopicPartition]] = []  # ("open" | "close", tp)
        self.fail: set[TopicPartition] = set()
        self.reason = ""  # the failed partitions' reason (TransactionError.failed); "": none
        self.broken: set[TopicPartition] = set()  # producers that failed (close_failed)

    async def open(self, tp: TopicPartition, timeout_s: float | None = None) -> None:
        self.events.append(("open", tp))
        self.sinks.setdefault(tp, FakeSink())

    async def close(self, tp: TopicPartition) -> None:
        self.events.append(("close", tp))
        self.sinks.pop(tp, None)

    async def send_from(
        self, tp: TopicPartition, records: Sequence[OutRecord]
    ) -> list[asyncio.Future[None]]:
        return await self.sinks.setdefault(tp, FakeSink()).send(records)

    async def close_failed(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, str]:
        """``broken``: partitions whose producer failed, closed here with ``reason``."""
        failed = {tp: self.reason or "aborted" for tp in tps if tp in self.broken}
        for tp in failed:
            self.broken.discard(tp)
            await self.close(tp)
        return failed

    async def commit(
        self, offsets: Mapping[TopicPartition, int], metadata: Mapping[TopicPartition, str]
    ) -> dict[TopicPartition, int]:
        failed = self.fail & set(offsets)
        done = {tp: o for tp, o in offsets.items() if tp not in failed}
        self.commits.append((done, {tp: metadata[tp] for tp in done}))
        if failed:
            for tp in failed:  # as the real one: a failed partition's producer is closed
                await self.close(tp)
            reasons = {tp: self.reason for tp in failed} if self.reason else None
            raise TransactionError(f"{sorted(failed)} aborted", done, reasons)
        return done


class FakeGate:
    """Delivery's gate as a transactional commit sees it (:meth:`Delivery.holding
    <consumer.finish.delivery.Delivery.holding>`): the partitions of ``quiet`` (None: all)
    are quiet at once; ``reopened`` lists what each commit let go."""

    def __init__(self, quiet: frozenset[TopicPartition] | None = None) -> None:
        self.quiet = quiet
        self.reopened: list[frozenset[TopicPartition]] = []

    @contextlib.asynccontextmanager
    async def holding(
        self, tps: frozenset[TopicPartition], timeout_s: float
    ) -> AsyncIterator[frozenset[TopicPartition]]:
        try:
            yield tps if self.quiet is None else self.quiet & tps
        finally:
            self.reopened.append(tps)


class FakeClock:
    """A monotonic clock the test moves (``now_s``; starts at 100 s)."""

    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


class OutcomesSink(Protocol):
    def on_outcomes(self, outcomes: Sequence[ItemOutcome]) -> None: ...


class FakeSource:
    """The pipeline's Kafka source: remembers commits (offsets and their metadata); ``stored``
    is what the group had committed before, ``(offset, metadata)`` per partition."""

    def __init__(self) -> None:
        self.commits: list[dict[TopicPartition, int]] = []
        self.metadata: list[dict[TopicPartition, str]] = []
        self.stored: dict[TopicPartition, tuple[int | None, str]] = {}
        self.paused: set[TopicPartition] = set()
        self.ends: dict[TopicPartition, int] = {}
        self.positions: dict[TopicPartition, int] = {}
        # The member's place in its group; a test bumps ``generation`` between a revoke and
        # an assignment for a rebalance without a break (consumer.serve.handover).
        self.member_id = "fake-member"
        self.generation = 1
        # False: eager rebalances (aiokafka, the classic protocol); True: incremental
        # (KIP-848), on_revoked/on_assigned get only the partitions that move.
        self.incremental = False

    async def poll(self, max_records: int, timeout_ms: int) -> list[InRecord]:
        return []

    def membership(self) -> Membership:
        return Membership(self.member_id, self.generation)

    async def commit(
        self, offsets: dict[TopicPartition, int], metadata: dict[TopicPartition, str]
    ) -> None:
        self.commits.append(dict(offsets))
        self.metadata.append(dict(metadata))

    async def committed_metadata(self, tp: TopicPartition) -> tuple[int | None, str]:
        return self.stored.get(tp, (None, ""))

    def pause(self, tps: frozenset[TopicPartition]) -> None:
        self.paused |= tps

    def resume(self, tps: frozenset[TopicPartition]) -> None:
        self.paused -= tps

    async def end_offsets(self, tps: frozenset[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.ends.get(tp, 0) for tp in tps}

    async def position(self, tp: TopicPartition) -> int | None:
        return self.positions.get(tp)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.positions[tp] = offset


class FakeEngine:
    def __init__(self) -> None:
        self.items: list[InferenceItem] = []
        self.cancelled: list[object] = []

    async def submit(
        self, items: Sequence[InferenceItem], on_outcomes: OutcomeCallback | None = None
    ) -> list[int]:
        self.items.extend(items)
        return [len(i.text.split()) + 2 for i in items]

    def cancel_group(self, group: object) -> list[int]:
        self.cancelled.append(group)
        return [i.item_id for i in self.items if i.group == group]

    async def flush(self) -> None:
        return None


class FakeRangeSource:
    """Serves fixed records per partition, ``chunk`` at a time; remembers commits."""

    def __init__(self, records: dict[int, list[InRecord]], ends: dict[int, int], chunk: int = 3):
        self._queues = {p: list(rs) for p, rs in records.items()}
        self._plan = {
            p: plan_partition(
                p, start_offset=0, end_offset=ends[p], log_start=0, log_end=ends[p], committed=None
            )
            for p in records
        }
        self._done = {p for p, r in self._plan.items() if r.remaining == 0}
        self._chunk = chunk
        self.commits: list[dict[int, int]] = []
        self.metadata: list[dict[int, str]] = []
        self.stop_after_polls: int | None = None
        self.stop: asyncio.Event | None = None
        self._polls = 0

    @property
    def plan(self) -> Mapping[int, PartitionRange]:
        return self._plan

    @property
    def finished(self) -> frozenset[int]:
        return frozenset(self._done)

    async def poll(self, max_records: int, timeout_ms: int) -> list[InRecord]:
        self._polls += 1
        if self.stop is not None and self.stop_after_polls == self._polls:
            self.stop.set()
        out: list[InRecord] = []
        for p, queue in self._queues.items():
            take = queue[: min(self._chunk, max_records - len(out))]
            del queue[: len(take)]
            out.extend(take)
            if not queue:
                self._done.add(p)
        await asyncio.sleep(0)
        return out

    async def commit(
        self,
        offsets: Mapping[TopicPartition, int],
        metadata: Mapping[TopicPartition, str] | None = None,
    ) -> None:
        """Recorded per partition number (the range is one topic's)."""
        self.commits.append({p: o for (_, p), o in offsets.items()})
        self.metadata.append({p: m for (_, p), m in (metadata or {}).items()})

    def last_committed(self) -> dict[int, int]:
        merged: dict[int, int] = {}
        for c in self.commits:
            merged.update(c)
        return merged


class AnsweringEngine:
    """Answers every item ``ok`` (a 2-d embedding) on the next loop turn, to its submit's
    callback (else to ``job.on_outcomes``)."""

    def __init__(self, job: OutcomesSink | None = None) -> None:
        self.job = job
        self.submitted: list[InferenceItem] = []
        self.in_flight = 0

    async def submit(
        self, items: Sequence[InferenceItem], on_outcomes: OutcomeCallback | None = None
    ) -> list[int]:
        loop = asyncio.get_running_loop()
        self.submitted.extend(items)
        self.in_flight += len(items)
        route = on_outcomes or (self.job.on_outcomes if self.job is not None else None)
        assert route is not None, "no callback to answer to"
        for it in items:
            loop.call_soon(self._answer, it, route)
        return [3] * len(items)

    def _answer(self, it: InferenceItem, route: OutcomeCallback) -> None:
        self.in_flight -= 1
        route([
            ItemOutcome(
                item_id=it.item_id, status="ok", result={"embedding": [0.6, 0.8], "dim": 2},
                error_code=None, error_message=None, truncated=False, n_tokens=3, queue_ms=0.1,
                infer_ms=0.2, batch_size=len(self.submitted), padded_len=3,
            )
        ])  # fmt: skip

    async def flush(self) -> None:
        return None

    async def drain(self, timeout_s: float | None = None) -> bool:
        while self.in_flight:
            await asyncio.sleep(0)
        return True
