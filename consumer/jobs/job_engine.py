"""The engine as one backfill job sees it: its items in the bulk lane, its outcomes its own.

Serve has one :class:`consumer.batching.engine.Engine`; the pipeline's items name the
pipeline's ``on_outcomes`` at each submit and have ids counting up from 0. A job's
:class:`BackfillJob` numbers its items from 0 too, so :class:`JobEngine` gives each item a
fresh engine id (:meth:`Engine.new_routed_id`, negative), submits it with its own callback and
restores the job's id on the way back, to the callback the job's submit named. Its items get
``lane="bulk"`` and a job-scoped ``group`` (serve's ``cancel_group`` of a revoked request
partition never drops a job's item). The lane scheduling is the engine's; this only
maps ids and counts what is in flight.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Hashable, Sequence
from typing import Protocol

from consumer.batching.routes import OutcomeCallback, add_to, call_each
from consumer.batching.types import InferenceItem, ItemOutcome

__all__ = ["BulkFlow", "JobEngine", "OutcomeCallback", "RoutingEngine"]


class RoutingEngine(Protocol):
    """What a job needs of :class:`consumer.batching.engine.Engine`."""

    def new_routed_id(self) -> int: ...
    async def submit(
        self, items: Sequence[InferenceItem], on_outcomes: OutcomeCallback | None = None
    ) -> list[int]: ...
    async def flush(self) -> None: ...
    def cancel_group(self, group: Hashable) -> list[int]: ...


class BulkFlow(Protocol):
    """What a job needs of serve's :class:`consumer.kafka.flow.FlowControl`: its items in
    flight count toward the flow totals, and it stops reading while bulk sources should pause
    (backpressure pauses bulk sources before live ones)."""

    def add_bulk(self, records: int, tokens: int) -> None: ...
    def remove_bulk(self, records: int, tokens: int) -> None: ...
    def should_pause_bulk(self) -> bool: ...


class JobEngine:
    """One job's view of serve's engine (``EngineLike`` of
    :class:`consumer.backfill.job.BackfillJob`); :meth:`drain` waits for this job's items only
    (serve's live items are not its business).

    Args:
        engine: serve's engine.
        job_id: the job's id (tags each item's ``group``).
        flow: serve's flow control; each item counts toward its totals (1 record, its tokens)
            from submit to outcome. ``None``: not counted.
    """

    def __init__(self, engine: RoutingEngine, job_id: str, flow: BulkFlow | None = None) -> None:
        self._engine = engine
        self.job_id = job_id
        self._flow = flow
        self._own_ids: dict[int, tuple[int, OutcomeCallback]] = {}  # engine id -> the job's
        self._tokens: dict[int, int] = {}  # engine id -> tokens counted into the flow
        self._groups: set[Hashable] = set()  # the engine groups this job's items were given
        self._dropping = False  # stop_computing() until resume_computing()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def in_flight(self) -> int:
        """Items submitted whose outcome has not come back yet."""
        return len(self._own_ids)

    def resume_computing(self) -> None:
        """End a :meth:`stop_computing` (the job's next assignment computes again)."""
        self._dropping = False

    def stop_computing(self) -> int:
        """Drop this job's items still queued in the engine (a batch already running
        finishes), and every item submitted from now until :meth:`resume_computing`.

        A dropped item gets no outcome: its record stays unfinished, so it is not committed
        and whoever reads the partition next computes it (the finished records above it are
        skipped through the commit metadata). Called when a job is cancelled, its partitions
        revoked or serve stops: the member then finishes at most one batch instead of
        everything it read (up to ``max_in_flight_records``, minutes of bulk work on a CPU,
        longer than the group's rebalance allows). Returns how many items were dropped.
        """
        self._dropping = True
        dropped: list[int] = []
        for group in list(self._groups):
            dropped += [i for i in self._engine.cancel_group(group) if i in self._own_ids]
        for i in dropped:
            del self._own_ids[i]
        self._uncount(dropped)
        self._set_idle_if_empty()
        return len(dropped)

    async def submit(
        self, items: Sequence[InferenceItem], on_outcomes: OutcomeCallback
    ) -> list[int]:
        """Submit ``items`` to the engine's bulk lane under fresh engine ids; their outcomes
        go to ``on_outcomes`` under the job's ids.

        Returns: each item's token count (:meth:`Engine.submit`).

        Raises: whatever :meth:`Engine.submit` raises (the items are then forgotten).
        """
        routed: list[InferenceItem] = []
        for item in items:
            rid = self._engine.new_routed_id()
            self._own_ids[rid] = (item.item_id, on_outcomes)
            group = ("kbatch.job", self.job_id, item.group)
            self._groups.add(group)
            routed.append(dataclasses.replace(item, item_id=rid, lane="bulk", group=group))
        if routed:
            self._idle.clear()
        try:
            n_tokens = await self._engine.submit(routed, on_outcomes=self._deliver)
        except BaseException:
            for r in routed:
                self._own_ids.pop(r.item_id, None)
            self._set_idle_if_empty()
            raise
        if self._flow is not None:
            # an outcome may already have come back (input_too_long): count only the rest
            open_ = [(r.item_id, n) for r, n in zip(routed, n_tokens, strict=True)
                     if r.item_id in self._own_ids]  # fmt: skip
            self._tokens.update(open_)
            self._flow.add_bulk(len(open_), sum(n for _, n in open_))
        if self._dropping:  # stopped while the chunk was being tokenized
            self.stop_computing()
        return n_tokens

    def should_pause_reading(self) -> bool:
        """Whether the job should read nothing now (serve's flow says bulk sources pause)."""
        return self._flow is not None and self._flow.should_pause_bulk()

    async def flush(self) -> None:
        """Flush the engine's partial batches."""
        await self._engine.flush()

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
        self._own_ids.clear()
        self._uncount(list(self._tokens))
        self._idle.set()

    def _deliver(self, outcomes: Sequence[ItemOutcome]) -> None:
        mine: list[tuple[OutcomeCallback, list[ItemOutcome]]] = []
        for o in outcomes:
            own = self._own_ids.pop(o.item_id, None)
            if own is not None:
                add_to(mine, own[1], dataclasses.replace(o, item_id=own[0]))
        self._uncount([o.item_id for o in outcomes])
        self._set_idle_if_empty()
        call_each(mine)

    def _uncount(self, engine_ids: list[int]) -> None:
        tokens = [t for i in engine_ids if (t := self._tokens.pop(i, None)) is not None]
        if tokens and self._flow is not None:
            self._flow.remove_bulk(len(tokens), sum(tokens))

    def _set_idle_if_empty(self) -> None:
        if not self._own_ids:
            self._idle.set()
