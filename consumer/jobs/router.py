"""One engine, several owners of its items: serve's pipeline and the jobs it runs.

The engine has one ``on_outcomes`` callback and item ids chosen by the caller. The pipeline
numbers its items from 0; each job's items get ids from :data:`JOB_ID_BASE` up (one counter for
all jobs, so no two owners ever share an id), their ``lane`` set to ``bulk``. The router's
:meth:`EngineRouter.on_outcomes` is the engine's callback: outcomes of ids below the base go to
the pipeline unchanged, the others to the job that submitted them, with the job's own ids
restored. Built outside the engine (issue 26: the lane scheduling is the engine's; this only
routes).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Protocol

from consumer.batching.types import InferenceItem, ItemOutcome

__all__ = ["JOB_ID_BASE", "EngineRouter", "JobEngine"]

JOB_ID_BASE = 1 << 52
"""First item id of job items; the pipeline's ids (a counter from 0) never reach it."""

OutcomeCallback = Callable[[Sequence[ItemOutcome]], None]


class SubmitEngine(Protocol):
    """What the router needs of :class:`consumer.batching.engine.Engine`."""

    async def submit(self, items: Sequence[InferenceItem]) -> list[int]: ...
    async def flush(self) -> None: ...


class EngineRouter:
    """Routes the engine's outcomes to the pipeline (``live``) or to a :class:`JobEngine`.

    Args:
        live: the pipeline's (or its fan-out's) ``on_outcomes``.
    """

    def __init__(self, live: OutcomeCallback) -> None:
        self._live = live
        self._engine: SubmitEngine | None = None
        self._ids = itertools.count(JOB_ID_BASE)
        self._owners: dict[int, tuple[JobEngine, int]] = {}

    def bind(self, engine: SubmitEngine) -> None:
        """Attach the engine (built after the router: it calls :meth:`on_outcomes`)."""
        self._engine = engine

    @property
    def engine(self) -> SubmitEngine:
        assert self._engine is not None, "bind() first"
        return self._engine

    def job_engine(self, job_id: str) -> JobEngine:
        """An engine view for one job's items (bind its job's ``on_outcomes`` to it)."""
        return JobEngine(self, job_id)

    def on_outcomes(self, outcomes: Sequence[ItemOutcome]) -> None:
        """The engine's callback: split ``outcomes`` by owner, restoring each job's ids."""
        live: list[ItemOutcome] = []
        jobs: dict[JobEngine, list[ItemOutcome]] = {}
        for outcome in outcomes:
            if outcome.item_id < JOB_ID_BASE:
                live.append(outcome)
                continue
            owner = self._owners.pop(outcome.item_id, None)
            if owner is None:  # its job already gave up on it (stopped past its deadline)
                continue
            job, own_id = owner
            jobs.setdefault(job, []).append(dataclasses.replace(outcome, item_id=own_id))
        if live:
            self._live(live)
        for job, mine in jobs.items():
            job.deliver(mine)

    def _register(self, job: JobEngine, own_id: int) -> int:
        routed = next(self._ids)
        self._owners[routed] = (job, own_id)
        return routed

    def _forget(self, job: JobEngine) -> None:
        for routed in [r for r, (j, _) in self._owners.items() if j is job]:
            del self._owners[routed]


class JobEngine:
    """The engine as one job sees it (``EngineLike`` of :class:`consumer.backfill.job.BackfillJob`):
    its items go to the bulk lane under router ids; :meth:`drain` waits for its own items only
    (serve's live items are not its business)."""

    def __init__(self, router: EngineRouter, job_id: str) -> None:
        self._router = router
        self.job_id = job_id
        self._on_outcomes: OutcomeCallback | None = None
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def bind(self, on_outcomes: OutcomeCallback) -> None:
        """Where this job's outcomes go (its ``BackfillJob.on_outcomes``)."""
        self._on_outcomes = on_outcomes

    async def submit(self, items: Sequence[InferenceItem]) -> list[int]:
        """Submit ``items`` to the engine's bulk lane (their ids are remapped on the way)."""
        routed: list[InferenceItem] = []
        for item in items:
            rid = self._router._register(self, item.item_id)
            # a job-scoped group: serve's cancel_group of a revoked partition never drops it
            group = ("kbatch.job", self.job_id, item.group)
            routed.append(dataclasses.replace(item, item_id=rid, lane="bulk", group=group))
        self.in_flight += len(routed)
        self._idle.clear()
        try:
            return await self._router.engine.submit(routed)
        except BaseException:
            for r in routed:
                if self._router._owners.pop(r.item_id, None) is not None:
                    self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()
            raise

    async def flush(self) -> None:
        """Flush the engine's partial batches."""
        await self._router.engine.flush()

    async def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until every item this job submitted has its outcome; False at ``timeout_s``."""
        if self._idle.is_set():
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        """Forget the items still in flight: their outcomes are dropped when they come."""
        self._router._forget(self)
        self.in_flight = 0
        self._idle.set()

    def deliver(self, outcomes: Sequence[ItemOutcome]) -> None:
        """The router: these outcomes (own ids restored) are this job's."""
        self.in_flight -= len(outcomes)
        if self.in_flight <= 0:
            self.in_flight = 0
            self._idle.set()
        if self._on_outcomes is not None:
            self._on_outcomes(outcomes)
