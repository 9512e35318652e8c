"""The asyncio driver of the batching policy: submit → tokenize → buckets → runner → outcomes.

docs/internals.md §Engine API. The engine owns three worker threads and one loop task:

::

    submit(items) ──► [tokenize thread] ──► BucketBatcher.add            (event loop)
                                              │ dispatcher task: pop_ready(now, max_batches=free)
                                              ▼
                    [collate thread, CUDA only: runner.prepare one batch ahead]
                                              ▼
                    [model thread: runner.run(batch)] ──► on_outcomes(a batch's ItemOutcomes)

- A batch is formed only when the runner can take it (one running, plus one being prepared
  when the runner prefetches): while the model is busy, arrivals keep joining their buckets,
  so the next batch is as full as it can be (the size-1 hand-off of text-embeddings-inference).
- Items whose ``deadline_s`` passes are answered ``expired`` and never computed, at their
  deadline: the dispatcher also wakes at the earliest queued item's deadline (the expiry
  sweep), even while every model slot is busy; checked again just before the model runs.
- A batch running longer than ``batch_timeout_s`` makes :attr:`Engine.healthy` false (and counts a
  watchdog trip) until it returns; a thread cannot be killed, so its owner acts on it:
  :attr:`Engine.running_batch_s` says how long the batch on the model has run
  (``kbatch serve`` stops once it is wedged: :mod:`consumer.serve.wedge`).
- Outcomes go to the callback each :meth:`Engine.submit` names (else the engine's default,
  given at construction; :mod:`consumer.batching.routes`), on the event loop thread, a list at
  a time (a batch's, a chunk's rejections, the items expired together); each submitted item's
  outcome (ok, error or expired) is in exactly one call, except for items removed by
  :meth:`Engine.cancel_group` or still queued at :meth:`Engine.stop`.

Lanes (docs/internals.md §Lanes): each item's ``lane`` (``live`` by default, or
``bulk``) picks one of two :class:`BucketBatcher` s — items of different lanes never share a
batch — and :class:`~consumer.batching.lanes.LaneScheduler` picks which lane's due batch takes
each free model slot: live first; bulk while the device is idle, in batches sized so that one
takes at most ``bulk_max_batch_ms``; bulk ahead of live only while it is below
``bulk_min_share`` of recent device time.

A second producer of items (serve's backfill job runner) shares the engine: it submits
``InferenceItem(lane="bulk", ...)`` with its own callback, ``await engine.submit(items,
on_outcomes=callback)``, and draws its item ids from :meth:`Engine.new_routed_id` (negative,
so they never collide with the pipeline's ids, which count up from 0); everything else
(expiry, cancel_group by its own ``group`` tags, flush, drain) is shared. Submit bulk work in
chunks of a poll's size (≤ a few hundred items) and only while ``queued_items_of("bulk")`` is
below about one batch's worth per free slot and a few more: the one tokenize thread is shared,
so a large bulk chunk delays the tokenization of live items behind it. A rerank job wraps the
engine in its own :class:`~consumer.batching.fanout.FanOutEngine` (``replace`` keeps each
pair's lane).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Literal, TypeVar

from consumer.batching.config import BatchPolicyConfig
from consumer.batching.errors import EngineClosedError
from consumer.batching.lanes import LaneScheduler
from consumer.batching.policy import BucketBatcher
from consumer.batching.protocols import BatchRunner, TokenizerLike
from consumer.batching.routes import OutcomeCallback, OutcomeRoutes
from consumer.batching.stats import NullStats, StatsSink
from consumer.batching.types import (
    Batch,
    InferenceItem,
    ItemOutcome,
    ItemRun,
    Lane,
    Rejected,
    TokenizedItem,
)
from consumer.batching.worker_thread import WorkerThread
from schemas.errors import ErrorCode

__all__ = ["Engine", "EngineClosedError", "WarmupMode"]

log = logging.getLogger(__name__)

WarmupMode = Literal["all", "largest", "none"]
BatchObserver = Callable[[Batch, float, float], None]
"""Called on the loop thread after the model ran a batch: ``(batch, start_s, end_s)``,
monotonic seconds of the engine's clock (``--tracing``'s batch spans)."""
_T = TypeVar("_T")

INLINE_TOKENIZE_CHARS = 1024
"""A :meth:`Engine.submit` chunk of at most this many characters (texts and text pairs) is
tokenized on the event loop; a larger one in the tokenizer thread.

A hand-off to the tokenizer thread and back costs the loop ~70 µs of CPU (executor submit, a
futex wake, the completion's self-pipe write and wake-up) whatever the chunk; the fast tokenizer
takes ~0.3-0.4 µs a character (MiniLM's, this project's 2-vCPU machine). At low rates a poll
chunk is one or a few short texts, and the hop cost more than the work: 1,024 characters keep
the loop blocked for at most ~0.4 ms (measured as the host path per request against a
plain aiokafka loop, which tokenizes inline)."""


def _chunk_chars(chunk: Sequence[InferenceItem]) -> int:
    return sum(len(it.text) + len(it.text_pair or "") for it in chunk)


class Engine:
    """Batches submitted items by token length and runs them on one model.

    Args:
        runner: computes batches (``consumer.model.batch_runner.ModelRunner``).
        tokenizer: tokenizes chunks (``consumer.model.tokenize.HFTokenizer``).
        policy_config: batch formation settings; :meth:`start` may lower
            ``max_batch_tokens`` (see :attr:`policy_config`).
        on_outcomes: the default callback: gets the outcomes of a submit that names none,
            on the loop thread, a list of :class:`ItemOutcome` at a time (a whole batch's
            together); an exception in it is logged and ignored. None: every submit names one.
        clock: monotonic seconds; ``InferenceItem.arrival_s``/``deadline_s`` use it too.
        stats: counters sink (``on_queue_wait``, ``on_expired``, ``on_watchdog``; give the same
            object to the runner for batch counters).
        batch_timeout_s: the per-batch watchdog: a batch running longer than this makes the
            engine unhealthy until it returns.
        warmup: which worst-case bucket shapes :meth:`start` runs: ``all`` buckets (GPU: shows
            a too-large budget and pre-builds kernels), the ``largest`` padded length only (CPU),
            or ``none``.
        on_batch_run: an observer of each batch the model ran (:data:`BatchObserver`); None
            (the default) costs nothing.

    Raises:
        ValueError: when ``max_batch_tokens`` cannot hold one item of the model's max length.
    """

    def __init__(
        self,
        runner: BatchRunner,
        tokenizer: TokenizerLike,
        policy_config: BatchPolicyConfig,
        on_outcomes: OutcomeCallback | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        stats: StatsSink | None = None,
        batch_timeout_s: float = 60.0,
        warmup: WarmupMode = "all",
        on_batch_run: BatchObserver | None = None,
    ) -> None:
        self._runner = runner
        self._on_batch_run = on_batch_run
        self._tokenizer = tokenizer
        self._clock = clock
        self._stats: StatsSink = stats if stats is not None else NullStats()
        self._warm = False
        self._warmup: WarmupMode = warmup
        self.max_length = min(runner.max_length, tokenizer.max_length)
        self.policy_config = policy_config
        self._batcher = BucketBatcher(policy_config, self.max_length)
        self._bulk = _bulk_batcher(policy_config, self.max_length)
        self._lanes = LaneScheduler(policy_config.bulk_min_share, policy_config.lane_share_window_s)
        self._on_outcomes = on_outcomes
        self._routes = OutcomeRoutes()
        self._prefetch = bool(runner.prefetch)
        self._depth = 2 if self._prefetch else 1
        self._tok_thread = WorkerThread("kbatch-tokenize")
        self._model_thread = WorkerThread("kbatch-model")
        self._prep_thread = WorkerThread("kbatch-collate") if self._prefetch else None
        self._state: Literal["new", "running", "stopping", "stopped"] = "new"
        self._wake = asyncio.Event()
        self._waiters: list[asyncio.Future[None]] = []  # flush/drain, woken by _notify
        self._model_lock = asyncio.Lock()
        self._dispatcher: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._in_pipeline = 0  # batches formed and not finished
        self._running_items = 0  # items in formed batches
        self._tokenizing = 0  # items inside submit()'s tokenization
        self._force = False
        self._watchdog = _Watchdog(batch_timeout_s, self._stats)

    # -- state ---------------------------------------------------------------------------

    @property
    def queued_items(self) -> int:
        """Items waiting in buckets (not yet in a batch), both lanes."""
        return self._batcher.queued_items + self._bulk.queued_items

    @property
    def queued_tokens(self) -> int:
        """Real tokens of the items waiting in buckets, both lanes."""
        return self._batcher.queued_tokens + self._bulk.queued_tokens

    def queued_items_of(self, lane: Lane) -> int:
        """Items of ``lane`` waiting in buckets."""
        return self._batcher_of(lane).queued_items

    @property
    def bulk_share(self) -> float:
        """The bulk lane's share of recent device time, in [0, 1] (1.0 before any batch)."""
        return self._lanes.bulk_share()

    @property
    def bulk_batch_cap_ms(self) -> float | None:
        """The bulk lane's batch-time cap in effect, ms (None: none, full batches):
        ``bulk_max_batch_ms``, or the automatic one (consumer/batching/lanes.py rule 2)."""
        return self._bulk.max_batch_ms

    @property
    def in_flight_items(self) -> int:
        """Items submitted and not yet answered: tokenizing, queued, or in a batch."""
        return self._tokenizing + self._batcher.queued_items + self._running_items

    @property
    def healthy(self) -> bool:
        """False while a batch runs past ``batch_timeout_s`` or once the engine has stopped."""
        return self._watchdog.stalled == 0 and self._state in ("new", "running")

    def running_batch_s(self) -> float:
        """Seconds (engine clock) the batch on the model now has been running; 0.0 when the
        model runs none. Safe to call from another thread."""
        since_s = self._watchdog.running_since_s
        return 0.0 if since_s is None else max(0.0, self._clock() - since_s)

    @property
    def warm(self) -> bool:
        """True once :meth:`start` has finished warming up (the engine takes work)."""
        return self._warm

    @property
    def bucket_edges(self) -> tuple[int, ...]:
        """The effective bucket edges (capped at the model's max length)."""
        return self._batcher.edges

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Warm up the worst-case shape of each bucket, then start batching.

        A shape that runs out of memory halves ``max_batch_tokens`` (logged as a warning)
        and warm-up starts over. Raises ``RuntimeError`` when even one item of the model's
        max length does not fit; re-raises any other warm-up error. Idempotent.
        """
        if self._state != "new":
            return
        await self._warm_up()
        self._warm = True
        self._state = "running"
        self._dispatcher = asyncio.create_task(self._dispatch(), name="kbatch-dispatch")

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Stop batching: waits up to ``timeout_s`` for running batches (their outcomes are
        still delivered) and drops what is still queued without outcomes — call
        :meth:`flush` and :meth:`drain` first for a graceful stop. Idempotent."""
        if self._state in ("stopping", "stopped"):
            return
        self._state = "stopping"
        if self._dispatcher is not None:
            self._dispatcher.cancel()
            await asyncio.gather(self._dispatcher, return_exceptions=True)
        if self._tasks:
            _done, pending = await asyncio.wait(set(self._tasks), timeout=timeout_s)
            if pending:
                log.error("stop: %d batch(es) still running after %.1f s", len(pending), timeout_s)
        for thread in (self._tok_thread, self._model_thread, self._prep_thread):
            if thread is not None:
                thread.shutdown()
        self._state = "stopped"
        self._routes.clear()
        self._notify()

    def new_routed_id(self) -> int:
        """A fresh item id for a submit with its own ``on_outcomes`` (negative: never one of
        the ids an owner counts up from 0, as serve's pipeline does)."""
        return self._routes.new_id()

    async def submit(
        self,
        items: Sequence[InferenceItem],
        on_outcomes: OutcomeCallback | None = None,
    ) -> list[int]:
        """Tokenize a chunk of items off the event loop and queue them for batching.

        Each item joins its ``lane``'s buckets. Returns each item's token count (special
        tokens included; for an ``input_too_long`` item, its length). An over-length item that
        may not be truncated is answered ``error``/``input_too_long`` (after this returns). If
        the tokenizer itself raises, every item of the chunk is answered ``inference_failed``.
        Outcomes go to ``on_outcomes`` when given, else to the engine's default callback.

        Raises:
            EngineClosedError: before :meth:`start` or after :meth:`stop`.
            ValueError: no callback and no default; ``on_outcomes`` given and an item's id is
                already routed (in flight).
        """
        if self._state != "running":
            raise EngineClosedError(f"engine is {self._state}")
        if not items:
            return []
        if on_outcomes is None and self._on_outcomes is None:
            raise ValueError("submit names no on_outcomes and the engine has no default")
        chunk = list(items)
        self._routes.add([it.item_id for it in chunk], on_outcomes)
        loop = asyncio.get_running_loop()
        self._tokenizing += len(chunk)
        try:
            if _chunk_chars(chunk) <= INLINE_TOKENIZE_CHARS:
                results = self._tokenizer.tokenize(chunk)  # cheaper here than a thread hop
                await asyncio.sleep(0)  # yield as the thread hop would (the dispatcher runs)
            else:
                results = await self._tok_thread.run(self._tokenizer.tokenize, chunk)
            if len(results) != len(chunk):
                raise RuntimeError(f"tokenizer returned {len(results)} for {len(chunk)} items")
        except Exception as exc:
            log.exception("tokenizer failed on a chunk of %d items", len(chunk))
            message = f"tokenization failed: {type(exc).__name__}"
            failed = [_failed(it, message) for it in chunk]
            loop.call_soon(self._routes.emit, failed, self._on_outcomes)
            return [0] * len(chunk)
        finally:
            self._tokenizing -= len(chunk)
        now = self._clock()
        counts: list[int] = []
        answered: list[ItemOutcome] = []
        for r in results:
            counts.append(r.n_tokens)
            if isinstance(r, Rejected):
                answered.append(_rejected(r, now))
            elif self._state == "running":
                self._batcher_of(r.item.lane).add(r, now)
            else:
                answered.append(_failed(r.item, "the engine stopped"))
        if answered:
            loop.call_soon(self._routes.emit, answered, self._on_outcomes)
        self._wake.set()
        return counts

    def cancel_group(self, group: Hashable) -> list[int]:
        """Drop the queued (not running) items of ``group``; returns their ``item_id``s.

        No outcome is delivered for them. Items of a :meth:`submit` still tokenizing are not
        affected (await pending submits first).
        """
        now = self._clock()
        removed = self._batcher.cancel_group(group, now) + self._bulk.cancel_group(group, now)
        ids = [t.item.item_id for t in removed]
        self._routes.forget(ids)
        if removed:
            self._wake.set()
        return ids

    async def flush(self) -> None:
        """Form batches from everything queued now, without waiting for deadlines, and
        return once nothing is left in the buckets (batches may still be running)."""
        self._force = True
        self._wake.set()
        try:
            await self._wait_for(lambda: self.queued_items == 0, None)
        finally:
            self._force = False

    async def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until nothing is tokenizing, queued or running; True if so within
        ``timeout_s`` seconds (None = no limit)."""
        return await self._wait_for(lambda: self.in_flight_items == 0, timeout_s)

    # -- internals -----------------------------------------------------------------------

    async def _warm_up(self) -> None:
        if self._warmup == "none":
            return
        config = self.policy_config
        while True:
            shapes = self._batcher.worst_case_shapes()
            if self._warmup == "largest":
                shapes = shapes[-1:]
            try:
                for n, seq_len in reversed(shapes):
                    await self._model_thread.run(self._runner.warmup, n, seq_len)
                return
            except Exception as exc:
                if not self._runner.is_oom(exc):
                    raise
                lowered = config.max_batch_tokens // 2
                if lowered < self.max_length:
                    raise RuntimeError(
                        f"warm-up: one item of {self.max_length} tokens does not fit the device "
                        f"(max_batch_tokens={config.max_batch_tokens})"
                    ) from exc
                log.warning(
                    "warm-up ran out of memory at max_batch_tokens=%d: lowering to %d",
                    config.max_batch_tokens,
                    lowered,
                )
                config = config.model_copy(update={"max_batch_tokens": lowered})
                self.policy_config = config
                self._batcher = BucketBatcher(config, self.max_length)
                self._bulk = _bulk_batcher(config, self.max_length)

    def _batcher_of(self, lane: Lane) -> BucketBatcher:
        return self._bulk if lane == "bulk" else self._batcher

    async def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            now = self._clock()
            expired = self._batcher.pop_ready(now, max_batches=0).expired
            expired += self._bulk.pop_ready(now, max_batches=0).expired
            if expired:
                self._expire(expired, now)
            launched = 0
            while True:  # one batch per free slot, the lane scheduler choosing whose
                lane = self._lanes.next_lane(
                    live_due=_due(self._batcher, now, self._force),
                    bulk_due=_due(self._bulk, now, self._force),
                    free_slots=self._depth - self._in_pipeline,
                    in_pipeline=self._in_pipeline,
                )
                if lane is None:
                    break
                ready = self._batcher_of(lane).pop_ready(now, max_batches=1, force=self._force)
                if ready.expired:
                    self._expire(ready.expired, now)
                if not ready.batches:
                    break
                self._launch(ready.batches[0])
                launched += 1
            self._notify()
            self._wake.clear()
            # Wake at the next bucket deadline of a lane that could start a batch, and at the
            # next item deadline in any case: the expiry sweep must not wait for a running batch.
            wake_at = [self._batcher.next_expiry(), self._bulk.next_expiry()]
            if self._in_pipeline < self._depth:
                wake_at.append(self._batcher.next_deadline())
                if self._lanes.bulk_may_start(self._in_pipeline):
                    wake_at.append(self._bulk.next_deadline())
            due = min((t for t in wake_at if t is not None), default=None)
            timeout: float | None = None
            if due is not None:
                timeout = max(0.0, due - self._clock())
                if timeout == 0.0 and not (launched or expired):
                    # Due but nothing formed or expired (a timer a hair early): yield once
                    # rather than spin.
                    timeout = 0.001
            if timeout is None:
                await self._wake.wait()
            else:
                handle = loop.call_later(timeout, self._wake.set)
                try:
                    await self._wake.wait()
                finally:
                    handle.cancel()

    def _launch(self, batch: Batch) -> None:
        self._in_pipeline += 1
        self._running_items += len(batch.items)
        task = asyncio.create_task(self._run_batch(batch), name="kbatch-batch")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_batch(self, batch: Batch) -> None:
        n_formed = len(batch.items)
        outcomes: list[ItemOutcome] = []
        try:
            prepared: object | None = None
            if self._prep_thread is not None:
                try:
                    prepared = await self._prep_thread.run(self._runner.prepare, batch)
                except Exception:
                    log.exception("collation failed; the model thread will retry it")
            async with self._model_lock:
                start = self._clock()
                live = [t for t in batch.items if not _overdue(t, start)]
                if len(live) != len(batch.items):
                    self._expire([t for t in batch.items if _overdue(t, start)], start)
                    if not live:
                        return
                    batch = Batch(live, max(t.n_tokens for t in live), batch.formed_s, batch.bucket)
                    prepared = None
                lane = live[0].item.lane
                for t in live:
                    self._stats.on_queue_wait((start - t.item.arrival_s) * 1000.0, lane)
                runs = await self._watchdog.watch(
                    self._model_thread.run(self._runner.run, batch, prepared),
                    batch,
                    start,
                )
                self._lanes.note_batch(lane, (self._clock() - start) * 1000.0, self._clock())
                if self._on_batch_run is not None:
                    self._on_batch_run(batch, start, self._clock())
            if len(runs) != len(batch.items):
                raise RuntimeError(f"runner returned {len(runs)} runs for {len(batch.items)}")
            outcomes = [_ok_or_error(t, r, start) for t, r in zip(batch.items, runs, strict=True)]
            if runs and runs[0].batch_size == len(batch.items):  # not split: one timing
                for batcher in (self._batcher, self._bulk):  # one device: one cost model
                    batcher.observe_batch(batch.padded_tokens, runs[0].infer_ms)
            if self.policy_config.bulk_max_batch_ms is None and self._bulk.measured:
                cap_ms = self._lanes.bulk_cap_ms(self._bulk.cost.fixed_ms, self._clock())
                self._bulk.set_max_batch_ms(cap_ms)
        except Exception as exc:  # never lose an item, never stop the engine
            log.exception("batch of %d failed outside the runner", len(batch.items))
            msg = f"batch failed: {type(exc).__name__}"
            outcomes = [_failed(t.item, msg, t) for t in batch.items]
        finally:
            self._in_pipeline -= 1
            self._wake.set()
            if not outcomes:  # all expired (emitted already), or cancelled
                self._running_items -= n_formed
        if not outcomes:
            self._notify()
            return
        # Let the dispatcher launch the next batch (whose model call then starts first)
        # before the outcomes go out: its wake-up (set above) runs before this callback.
        # The items count as running until they have.
        asyncio.get_running_loop().call_soon(self._emit_batch, outcomes, n_formed)

    def _emit_batch(self, outcomes: list[ItemOutcome], n_formed: int) -> None:
        try:
            self._routes.emit(outcomes, self._on_outcomes)
        finally:
            self._running_items -= n_formed
            self._notify()

    def _expire(self, items: list[TokenizedItem], now: float) -> None:
        self._stats.on_expired(len(items))
        self._routes.emit(
            [
                ItemOutcome(
                    item_id=t.item.item_id,
                    status="expired",
                    result=None,
                    error_code=ErrorCode.DEADLINE_EXCEEDED,
                    error_message="the request's deadline passed before compute",
                    truncated=t.truncated,
                    n_tokens=t.n_tokens,
                    queue_ms=(now - t.item.arrival_s) * 1000.0,
                    infer_ms=0.0,
                    batch_size=0,
                    padded_len=0,
                    group=t.item.group,
                )
                for t in items
            ],
            self._on_outcomes,
        )

    def _notify(self) -> None:
        """Wake every :meth:`_wait_for` (each checks its predicate again); nothing to do,
        and nothing allocated, while none waits (this runs once per batch)."""
        if self._waiters:
            waiters, self._waiters = self._waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    async def _wait_for(self, predicate: Callable[[], bool], timeout_s: float | None) -> bool:
        async def wait() -> None:
            loop = asyncio.get_running_loop()
            while not (predicate() or self._state == "stopped"):
                waiter: asyncio.Future[None] = loop.create_future()
                self._waiters.append(waiter)
                await waiter

        try:
            await asyncio.wait_for(wait(), timeout_s)
        except TimeoutError:
            return False
        return predicate()


class _Watchdog:
    """Marks the engine unhealthy while a batch runs past ``batch_timeout_s``; remembers
    when the batch on the model started (one at a time: the engine's model lock)."""

    def __init__(self, batch_timeout_s: float, stats: StatsSink) -> None:
        self._timeout_s = batch_timeout_s
        self._stats = stats
        self.stalled = 0  # batches running past the timeout now
        self.running_since_s: float | None = None  # engine clock; None: the model is idle

    async def watch(self, fut: asyncio.Future[_T], batch: Batch, start_s: float) -> _T:
        """Await the model thread's ``fut`` (started at ``start_s``, engine clock); one timer
        handle (no extra task or future per batch) counts it stalled while it runs past the
        timeout."""
        tripped = False
        self.running_since_s = start_s

        def trip() -> None:
            nonlocal tripped
            tripped = True
            self.stalled += 1
            self._stats.on_watchdog()
            log.error(
                "batch of %d × %d tokens running longer than %.1f s: engine unhealthy",
                len(batch.items),
                batch.padded_len,
                self._timeout_s,
            )

        timer = asyncio.get_running_loop().call_later(self._timeout_s, trip)
        try:
            return await fut
        finally:
            timer.cancel()
            self.running_since_s = None
            if tripped:
                self.stalled -= 1


def _bulk_batcher(config: BatchPolicyConfig, max_length: int) -> BucketBatcher:
    return BucketBatcher(config, max_length, max_batch_ms=config.bulk_max_batch_ms)


def _due(batcher: BucketBatcher, now: float, force: bool) -> bool:
    """Whether ``batcher`` has a batch to form now (``force``: anything queued)."""
    if not batcher.queued_items:
        return False
    if force:
        return True
    due = batcher.next_deadline()
    return due is not None and due <= now


def _overdue(t: TokenizedItem, now: float) -> bool:
    d = t.item.deadline_s
    return d is not None and d <= now


def _ok_or_error(t: TokenizedItem, r: ItemRun, start: float) -> ItemOutcome:
    ok = r.result is not None and r.error_code is None
    return ItemOutcome(
        item_id=t.item.item_id,
        status="ok" if ok else "error",
        result=r.result if ok else None,
        error_code=None if ok else str(r.error_code or ErrorCode.INFERENCE_FAILED),
        error_message=None if ok else (r.error_message or "inference failed"),
        truncated=t.truncated,
        n_tokens=t.n_tokens,
        queue_ms=(start - t.item.arrival_s) * 1000.0,
        infer_ms=r.infer_ms,
        batch_size=r.batch_size,
        padded_len=r.padded_len,
        group=t.item.group,
    )


def _failed(item: InferenceItem, message: str, t: TokenizedItem | None = None) -> ItemOutcome:
    return ItemOutcome(
        item_id=item.item_id,
        status="error",
        result=None,
        error_code=ErrorCode.INFERENCE_FAILED,
        error_message=message,
        truncated=t.truncated if t else False,
        n_tokens=t.n_tokens if t else 0,
        queue_ms=0.0,
        infer_ms=0.0,
        batch_size=0,
        padded_len=0,
        group=item.group,
    )


def _rejected(r: Rejected, now: float) -> ItemOutcome:
    return ItemOutcome(
        item_id=r.item.item_id,
        status="error",
        result=None,
        error_code=r.error_code,
        error_message=r.error_message,
        truncated=False,
        n_tokens=r.n_tokens,
        queue_ms=(now - r.item.arrival_s) * 1000.0,
        infer_ms=0.0,
        batch_size=0,
        padded_len=0,
        group=r.item.group,
    )
