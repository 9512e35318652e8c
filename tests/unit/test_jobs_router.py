"""The engine router: job items get their own ids and the bulk lane; outcomes find their owner."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from consumer.batching.types import InferenceItem, ItemOutcome
from consumer.jobs.router import JOB_ID_BASE, EngineRouter


class _Engine:
    def __init__(self) -> None:
        self.items: list[InferenceItem] = []
        self.flushes = 0

    async def submit(self, items: Sequence[InferenceItem]) -> list[int]:
        self.items.extend(items)
        return [1] * len(items)

    async def flush(self) -> None:
        self.flushes += 1


def _outcome(item_id: int, **kw: Any) -> ItemOutcome:
    base: dict[str, Any] = dict(
        item_id=item_id, status="ok", result={"x": item_id}, error_code=None,
        error_message=None, truncated=False, n_tokens=3, queue_ms=0.0, infer_ms=1.0,
        batch_size=2, padded_len=3,
    )  # fmt: skip
    return ItemOutcome(**{**base, **kw})


async def test_job_items_go_bulk_under_router_ids_and_come_back_with_their_own() -> None:
    live: list[ItemOutcome] = []
    router = EngineRouter(live.extend)
    engine = _Engine()
    router.bind(engine)
    a, b = router.job_engine("a"), router.job_engine("b")
    got_a: list[ItemOutcome] = []
    got_b: list[ItemOutcome] = []
    a.bind(got_a.extend)
    b.bind(got_b.extend)
    await a.submit([InferenceItem(0, "x", 0.0, group=("src", 0))])
    await b.submit([InferenceItem(0, "y", 0.0)])  # the same own id as a's: no collision
    routed = [i.item_id for i in engine.items]
    assert routed == [JOB_ID_BASE, JOB_ID_BASE + 1]
    assert [i.lane for i in engine.items] == ["bulk", "bulk"]
    assert engine.items[0].group == ("kbatch.job", "a", ("src", 0))
    router.on_outcomes([_outcome(7), _outcome(routed[1]), _outcome(routed[0])])
    assert [o.item_id for o in live] == [7]
    assert [(o.item_id, o.result) for o in got_a] == [(0, {"x": JOB_ID_BASE})]
    assert [o.item_id for o in got_b] == [0]
    assert (a.in_flight, b.in_flight) == (0, 0)


async def test_drain_waits_for_the_jobs_own_items_only() -> None:
    router = EngineRouter(lambda outcomes: None)
    router.bind(_Engine())
    job = router.job_engine("a")
    job.bind(lambda outcomes: None)
    await job.submit([InferenceItem(5, "x", 0.0), InferenceItem(6, "y", 0.0)])
    assert await job.drain(0.01) is False
    router.on_outcomes([_outcome(JOB_ID_BASE)])
    waiter = asyncio.create_task(job.drain(5))
    await asyncio.sleep(0)
    assert not waiter.done()
    router.on_outcomes([_outcome(JOB_ID_BASE + 1), _outcome(3)])  # 3: a live item
    assert await waiter is True
    await job.flush()


async def test_a_closed_job_drops_late_outcomes() -> None:
    router = EngineRouter(lambda outcomes: None)
    router.bind(_Engine())
    job = router.job_engine("a")
    got: list[ItemOutcome] = []
    job.bind(got.extend)
    await job.submit([InferenceItem(0, "x", 0.0)])
    job.close()
    assert await job.drain(0) is True
    router.on_outcomes([_outcome(JOB_ID_BASE)])
    assert got == []
