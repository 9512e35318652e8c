"""A job's view of serve's engine: its items get fresh engine ids and the bulk lane; its
outcomes come back to it under its own ids; drain waits for its own items only."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import Any

from consumer.batching.types import InferenceItem, ItemOutcome
from consumer.jobs.job_engine import JobEngine, OutcomeCallback


class _Engine:
    """Records submits and their callbacks, as :class:`Engine` routes them."""

    def __init__(self) -> None:
        self.items: list[InferenceItem] = []
        self.routes: dict[int, OutcomeCallback] = {}
        self._ids = itertools.count(-1, -1)
        self.flushes = 0

    def new_routed_id(self) -> int:
        return next(self._ids)

    async def submit(
        self, items: Sequence[InferenceItem], on_outcomes: OutcomeCallback | None = None
    ) -> list[int]:
        assert on_outcomes is not None
        self.items.extend(items)
        self.routes.update({i.item_id: on_outcomes for i in items})
        return [1] * len(items)

    def answer(self, *ids: int) -> None:
        for i in ids:
            self.routes.pop(i)([_outcome(i)])

    async def flush(self) -> None:
        self.flushes += 1

    def cancel_group(self, group: object) -> list[int]:
        """Every unanswered item counts as queued here."""
        gone = [i.item_id for i in self.items if i.group == group and i.item_id in self.routes]
        for i in gone:
            del self.routes[i]
        return gone


def _outcome(item_id: int, **kw: Any) -> ItemOutcome:
    base: dict[str, Any] = dict(
        item_id=item_id, status="ok", result={"x": item_id}, error_code=None,
        error_message=None, truncated=False, n_tokens=3, queue_ms=0.0, infer_ms=1.0,
        batch_size=2, padded_len=3,
    )  # fmt: skip
    return ItemOutcome(**{**base, **kw})


async def test_job_items_go_bulk_under_engine_ids_and_come_back_with_their_own() -> None:
    engine = _Engine()
    a, b = JobEngine(engine, "a"), JobEngine(engine, "b")
    got_a: list[ItemOutcome] = []
    got_b: list[ItemOutcome] = []
    await a.submit([InferenceItem(0, "x", 0.0, group=("src", 0))], got_a.extend)
    await b.submit([InferenceItem(0, "y", 0.0)], got_b.extend)  # a's own id: no collision
    routed = [i.item_id for i in engine.items]
    assert routed == [-1, -2]
    assert [i.lane for i in engine.items] == ["bulk", "bulk"]
    assert engine.items[0].group == ("kbatch.job", "a", ("src", 0))
    engine.answer(-2, -1)
    assert [(o.item_id, o.result) for o in got_a] == [(0, {"x": -1})]
    assert [o.item_id for o in got_b] == [0]
    assert (a.in_flight, b.in_flight) == (0, 0)


async def test_drain_waits_for_the_jobs_own_items_only() -> None:
    engine = _Engine()
    job = JobEngine(engine, "a")
    await job.submit([InferenceItem(5, "x", 0.0), InferenceItem(6, "y", 0.0)], lambda _: None)
    assert await job.drain(0.01) is False
    engine.answer(-1)
    waiter = asyncio.create_task(job.drain(5))
    await asyncio.sleep(0)
    assert not waiter.done()
    engine.answer(-2)
    assert await waiter is True
    await job.flush()
    assert engine.flushes == 1


async def test_a_closed_job_drops_late_outcomes() -> None:
    engine = _Engine()
    job = JobEngine(engine, "a")
    got: list[ItemOutcome] = []
    await job.submit([InferenceItem(0, "x", 0.0)], got.extend)
    job.close()
    assert await job.drain(0) is True
    engine.answer(-1)
    assert got == []


async def test_job_items_count_toward_the_flow_totals_until_answered() -> None:
    from consumer.kafka.flow import FlowConfig, FlowControl

    flow = FlowControl(FlowConfig(max_total_records=4, max_total_tokens=1_000))
    engine = _Engine()  # every item counts 1 token
    job = JobEngine(engine, "a", flow)
    assert job.should_pause_reading() is False
    await job.submit([InferenceItem(i, "x", 0.0) for i in range(2)], lambda _: None)
    # 2 of 4 records: the bulk watermark (bulk_total_fraction 0.5 of the total limit)
    assert job.should_pause_reading() is True
    engine.answer(-1, -2)
    assert job.should_pause_reading() is False  # at or below the low watermark again
    await job.submit([InferenceItem(9, "y", 0.0)], lambda _: None)
    job.close()  # what a closed job had in flight leaves the totals too
    assert job.should_pause_reading() is False


async def test_stop_computing_drops_queued_items_and_later_submits_until_resumed() -> None:
    engine = _Engine()
    job = JobEngine(engine, "a")
    got: list[ItemOutcome] = []
    await job.submit([InferenceItem(i, "x", 0.0, group=("src", 0)) for i in range(3)], got.extend)
    engine.answer(-1)  # one answered before the stop
    assert job.stop_computing() == 2  # the other two were still queued
    assert await job.drain(0) is True  # nothing left to wait for
    # a chunk whose tokenizing was under way when the stop came is dropped too
    await job.submit([InferenceItem(7, "y", 0.0, group=("src", 1))], got.extend)
    assert job.in_flight == 0 and -4 not in engine.routes
    job.resume_computing()  # the next assignment computes again
    await job.submit([InferenceItem(8, "z", 0.0, group=("src", 1))], got.extend)
    engine.answer(-5)
    assert [o.item_id for o in got] == [0, 8]
