"""The pure batching policy: token-length buckets, deadlines, budgets. No asyncio, no torch.

Driven by an injected clock — every method that needs the time takes ``now`` (monotonic
seconds) — so the tests step time by hand. The policy returns decisions (:class:`Ready`);
the engine acts on them.

Rules:

1. Each bucket holds token lengths in ``(edges[i-1], edges[i]]`` and has its own FIFO queue.
2. A bucket's deadline is its **oldest** item's ``arrival_s + max_wait``; later arrivals never
   push it back (the classic bug: a timer restarted per arrival starves the first request).
3. A bucket is *due* when it is full (``max_batch_size`` items, or its padded tokens reach
   ``max_batch_tokens``), when its deadline passes, or — with ``adaptive_wait`` — when its
   decayed arrival rate says it cannot fill before the deadline (no waiting for nothing).
4. Batches take the bucket's items in arrival order (one partition's first, rule 7), up to
   ``max_batch_size`` and the padded token budget; a bucket holding more than one batch
   stays due (a backlog flushes at once).
   On a deadline flush, ``preferred_batch_sizes`` picks the largest preferred size that fits.
5. A deadline flush (the bucket is not full) also takes the oldest items of the nearest
   non-empty, under-filled buckets below and above, one bucket at a time, while the padding
   this adds is smaller than ``batch_overhead_tokens`` (the fixed cost of the batch it saves:
   a batch's time ≈ fixed cost + padded tokens). Under moderate load this turns many one- or
   two-item batches, one per bucket, into a few larger ones; full buckets never mix.
6. Items whose ``deadline_s`` has passed are returned as expired and never batched; the
   engine wakes at :meth:`BucketBatcher.next_expiry` to collect them at their deadline.
7. Fairness across partitions (the item's ``group``): among the due buckets, the group served
   least recently goes first, oldest item first among equals, and the batch starts with that
   group's items of the bucket. A backlog of one partition (say, long texts) then takes every
   other batch at most while other partitions have due work, instead of holding them until it
   has drained (arrival order across partitions did that: ~7 s of held commits).

8. The measured batch cost (:class:`~consumer.batching.cost.BatchCostModel`, fitted from the
   runner's timings the engine passes to :meth:`BucketBatcher.observe_batch`) takes over once
   :data:`MIN_FIT_BATCHES` batches have run: rule 3's adaptive wait also ends when the batch
   cannot fill within one batch's fixed cost (waiting longer costs every queued item more than
   a second batch would: the device runs what is there as soon as it is idle); and with
   ``target_p99_ms`` a batch holds at most the padded tokens that finish within half the
   target (an item may wait out one running batch, then ride the next: Triton's queue delay,
   TEI's token budget, set from the device's measured speed). Rule 5 counts
   :data:`MERGE_SHARE` of the fitted fixed cost when that exceeds ``batch_overhead_tokens``
   (a launch-bound device — a GPU, ``sim:`` — merges whole buckets; a CPU keeps ~32 tokens).

Sorting inside a bucket is deliberately not done: with edges ~10 % apart, a batch padded to its
longest item already wastes < 5 % (measured 0.96–0.97 on the VADER mix), and FIFO order keeps
every item's wait bounded by the deadline rule.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections import Counter, deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from consumer.batching.config import BatchPolicyConfig
from consumer.batching.cost import BatchCostModel
from consumer.batching.types import Batch, TokenizedItem

__all__ = ["MERGE_SHARE", "MIN_FIT_BATCHES", "BucketBatcher", "Ready"]

MIN_FIT_BATCHES = 8
"""Batches observed before the cost model's fit replaces the configured guesses (rule 8)."""

MERGE_SHARE = 0.25
"""The share of the measured fixed cost that rule 5 counts as saved by a merge (rule 8).

The whole fixed cost overstates it under load: an item left in its bucket joins the next batch
of its length rather than running alone. Chosen on a fake-clock simulation of Poisson arrivals
(lognormal lengths, median 27 tokens; ``tests/unit/test_batching_cost.py``): CPU-like device
(17 ms + 118 µs/token, fitted overhead 144 tokens) at 0.7 × capacity, p50/p99 204/607 ms
merging at 32 tokens, 366/979 at 144; simulated H200 (1 ms + 0.445 µs/token, 2247 tokens) at
20,000/s, 14.7/29.5 ms at 32, 7.5/14.2 at 2000, 4.1/7.7 at 500."""

PRIOR_PER_TOKEN_US = 120.0
"""The cost model's prior per padded token (CPU MiniLM; only the ratio to the fixed cost,
``batch_overhead_tokens``, matters before the fit, and nothing reads it after)."""


@dataclass(slots=True)
class Ready:
    """A decision of :meth:`BucketBatcher.pop_ready`: batches to run and items to expire."""

    batches: list[Batch] = field(default_factory=list)
    expired: list[TokenizedItem] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.batches or self.expired)


class _Bucket:
    """One length bucket: FIFO queue plus cached aggregates and a decayed arrival rate.

    The aggregates are kept incrementally, so forming a batch costs O(items taken), not
    O(items queued) (a backlog of thousands in one bucket made every batch rescan them all):
    ``tokens`` and ``groups`` by subtraction, ``max_tokens`` from a count per length (a bucket
    spans a few lengths), ``oldest_s`` from the FIFO head while the queue is in arrival order
    (``in_order``; a full scan otherwise, e.g. after :func:`_put_group_first` reordered it).
    """

    __slots__ = (
        "groups",
        "in_order",
        "index",
        "items",
        "lengths",
        "max_tokens",
        "oldest_s",
        "rate_t",
        "rate_x",
        "tokens",
    )

    def __init__(self, index: int) -> None:
        self.index = index
        self.items: deque[TokenizedItem] = deque()
        self.tokens = 0  # real tokens queued
        self.max_tokens = 0  # longest queued item
        self.oldest_s = math.inf  # min arrival_s queued
        self.groups: Counter[Hashable | None] = Counter()  # queued items per group
        self.lengths: dict[int, int] = {}  # n_tokens → queued items of that length
        self.in_order = True  # arrival_s non-decreasing along the queue
        self.rate_x = 0.0  # exponentially decayed arrival count
        self.rate_t = -math.inf  # time of the last decay update

    def append(self, t: TokenizedItem) -> None:
        """Queue ``t`` at the tail and update the aggregates."""
        if self.items and t.item.arrival_s < self.items[-1].item.arrival_s:
            self.in_order = False
        self.items.append(t)
        self.tokens += t.n_tokens
        self.max_tokens = max(self.max_tokens, t.n_tokens)
        self.oldest_s = min(self.oldest_s, t.item.arrival_s)
        self.groups[t.item.group] += 1
        self.lengths[t.n_tokens] = self.lengths.get(t.n_tokens, 0) + 1

    def pop_head(self, k: int) -> None:
        """Remove the first ``k`` queued items and update the aggregates."""
        lost_max = False
        for _ in range(k):
            t = self.items.popleft()
            self.tokens -= t.n_tokens
            g = t.item.group
            if self.groups[g] > 1:
                self.groups[g] -= 1
            else:
                del self.groups[g]
            left = self.lengths[t.n_tokens] - 1
            if left:
                self.lengths[t.n_tokens] = left
            else:
                del self.lengths[t.n_tokens]
                lost_max = lost_max or t.n_tokens == self.max_tokens
        if not self.items:
            self.recompute()
            return
        if lost_max:
            self.max_tokens = max(self.lengths)
        if self.in_order:
            self.oldest_s = self.items[0].item.arrival_s
        else:
            self.oldest_s = min(t.item.arrival_s for t in self.items)

    def note_reordered(self) -> None:
        """The queue's order changed: re-derive ``in_order`` (O(n), like the reorder)."""
        arrivals = (t.item.arrival_s for t in self.items)
        self.in_order = all(a <= b for a, b in itertools.pairwise(arrivals))

    def recompute(self) -> None:
        """Rebuild every aggregate from the queue (after items left from its middle)."""
        self.tokens = sum(t.n_tokens for t in self.items)
        self.max_tokens = max((t.n_tokens for t in self.items), default=0)
        self.oldest_s = min((t.item.arrival_s for t in self.items), default=math.inf)
        self.groups = Counter(t.item.group for t in self.items)
        self.lengths = {}
        for t in self.items:
            self.lengths[t.n_tokens] = self.lengths.get(t.n_tokens, 0) + 1
        self.note_reordered()

    def rate_per_s(self, now: float, window_s: float) -> float:
        """Arrivals per second, exponentially decayed with time constant ``window_s``."""
        if self.rate_x == 0.0:
            return 0.0
        return self.rate_x * math.exp(-max(0.0, now - self.rate_t) / window_s) / window_s

    def note_arrival(self, now: float, window_s: float) -> None:
        decay = math.exp(-max(0.0, now - self.rate_t) / window_s) if self.rate_x else 0.0
        self.rate_x = self.rate_x * decay + 1.0
        self.rate_t = max(now, self.rate_t)


class BucketBatcher:
    """Token-length buckets with per-bucket deadlines, a padded-token budget and expiry.

    Args:
        config: the batching settings.
        max_length: the model's maximum length in tokens (the last bucket edge).
        max_batch_ms: once the cost model has measured the device (rule 8), a batch holds at
            most the padded tokens that finish within this many milliseconds (never below one
            item of ``max_length``); the engine's bulk lane passes ``bulk_max_batch_ms``
            (consumer/batching/lanes.py). None = no such cap.

    Raises:
        ValueError: when ``config.max_batch_tokens`` cannot hold one item of ``max_length``.

    Not thread-safe: one owner (the engine's event loop) calls it.
    """

    def __init__(
        self, config: BatchPolicyConfig, max_length: int, *, max_batch_ms: float | None = None
    ) -> None:
        self.config = config
        self.max_length = max_length
        self.max_batch_ms = max_batch_ms
        self.edges: tuple[int, ...] = config.edges_for(max_length)
        self._buckets = [_Bucket(i) for i in range(len(self.edges))]
        self._due: list[float] = [math.inf] * len(self.edges)
        self._queued_items = 0
        self._queued_tokens = 0
        self._with_deadline = 0  # queued items that carry a deadline_s
        # Their deadlines, earliest first: (deadline_s, tie-break, item); entries of items
        # no longer queued (not in ``_queued_deadlines``, by identity) are skipped lazily.
        self._deadlines: list[tuple[float, int, TokenizedItem]] = []
        self._queued_deadlines: set[int] = set()
        self._pushes = itertools.count()
        # Rule 7: the turn (a batch counter) at which each group was last in a batch.
        self._turn = 0
        self._served: dict[Hashable | None, int] = {}
        # Rule 8: the device's measured cost, and the padded-token budget it implies.
        self.cost = BatchCostModel(
            prior_fixed_ms=config.batch_overhead_tokens * PRIOR_PER_TOKEN_US / 1000.0,
            prior_per_token_us=PRIOR_PER_TOKEN_US,
        )
        self._refit_budget()

    # -- introspection -------------------------------------------------------------------

    @property
    def queued_items(self) -> int:
        """Items waiting in all buckets."""
        return self._queued_items

    @property
    def queued_tokens(self) -> int:
        """Real (unpadded) tokens waiting in all buckets."""
        return self._queued_tokens

    def bucket_of(self, n_tokens: int) -> int:
        """Index of the bucket for an item of ``n_tokens`` (the first edge ≥ it).

        Raises ``ValueError`` when ``n_tokens`` is not in ``[1, max_length]``.
        """
        if not 1 <= n_tokens <= self.max_length:
            raise ValueError(f"n_tokens={n_tokens} outside [1, max_length={self.max_length}]")
        return bisect.bisect_left(self.edges, n_tokens)

    @property
    def budget_tokens(self) -> int:
        """Padded tokens a batch may hold now: ``max_batch_tokens``, lowered by
        ``target_p99_ms`` (or ``max_batch_ms``) once the device is measured (rule 8), never
        below one item of ``max_length``."""
        return self._budget_tokens

    @property
    def measured(self) -> bool:
        """True once the cost model has seen :data:`MIN_FIT_BATCHES` batches (rule 8)."""
        return self.cost.batches >= MIN_FIT_BATCHES

    def batch_capacity(self, padded_len: int) -> int:
        """Items a batch padded to ``padded_len`` tokens may hold under both limits."""
        return max(1, min(self.config.max_batch_size, self._budget_tokens // padded_len))

    def observe_batch(self, padded_tokens: int, batch_ms: float) -> None:
        """The runner computed a batch of ``padded_tokens`` (size × padded length) in
        ``batch_ms`` milliseconds: refit the cost model and the token budget (rule 8)."""
        self.cost.observe(padded_tokens, batch_ms)
        self._refit_budget()

    def set_max_batch_ms(self, max_batch_ms: float | None) -> None:
        """Change the ``max_batch_ms`` cap (None: none) and refit the token budget; the
        engine's automatic bulk cap (consumer/batching/lanes.py rule 2) moves it per batch."""
        if max_batch_ms != self.max_batch_ms:
            self.max_batch_ms = max_batch_ms
            self._refit_budget()

    def _refit_budget(self) -> None:
        self._budget_tokens = fit_budget(self.config, self.cost, self.max_length, self.max_batch_ms)

    def worst_case_shapes(self) -> list[tuple[int, int]]:
        """``(batch_size, padded_len)`` of each bucket's largest possible batch (for warm-up)."""
        return [(self.batch_capacity(e), e) for e in self.edges]

    # -- the three operations ------------------------------------------------------------

    def add(self, item: TokenizedItem, now: float) -> None:
        """Queue ``item`` in its length bucket at time ``now`` (monotonic seconds).

        The bucket's deadline is ``min(arrival_s of its items) + max_wait``; ``now`` feeds the
        bucket's arrival-rate estimate. Raises ``ValueError`` for ``n_tokens`` outside
        ``[1, max_length]``.
        """
        b = self._buckets[self.bucket_of(item.n_tokens)]
        b.append(item)
        b.note_arrival(now, self.config.rate_window_s)
        self._queued_items += 1
        self._queued_tokens += item.n_tokens
        if item.item.deadline_s is not None:
            self._with_deadline += 1
            heapq.heappush(self._deadlines, (item.item.deadline_s, next(self._pushes), item))
            self._queued_deadlines.add(id(item))
        self._update_due(b, now)

    def pop_ready(
        self, now: float, *, max_batches: int | None = None, force: bool = False
    ) -> Ready:
        """Expire overdue items and form the batches that are due at ``now``.

        Args:
            now: monotonic seconds.
            max_batches: form at most this many batches (the engine asks for one when its
                runner can take one, so later arrivals can still join the others); ``None`` =
                every due batch. Expired items are always returned.
            force: treat every bucket as due (shutdown flush): form batches now, no waiting.

        Returns:
            :class:`Ready`: batches ordered by their oldest item (earliest deadline first) and
            the expired items (``deadline_s <= now``), which will never be computed.
        """
        out = Ready()
        if self._with_deadline:
            out.expired = self.cancel(_overdue_at(now), now)
        limit = math.inf if max_batches is None else max_batches
        while len(out.batches) < limit:
            due = [b for b in self._buckets if b.items and (force or self._due[b.index] <= now)]
            if not due:
                break
            bucket, group = self._next_turn(due)
            _put_group_first(bucket, group)
            batch = self._form(bucket, now, deadline_flush=not self._is_full(bucket))
            self._turn += 1
            for t in batch.items:
                self._served[t.item.group] = self._turn
            out.batches.append(batch)
        return out

    def _next_turn(self, due: list[_Bucket]) -> tuple[_Bucket, Hashable | None]:
        """Rule 7: the due bucket and group to serve next.

        The group (partition) served least recently goes first — a group never served, or
        not since the others were, before one just served — and among equals the oldest
        item (the earliest bucket deadline). With one group this is oldest-deadline-first.
        """
        best: tuple[tuple[int, float], _Bucket, Hashable | None] | None = None
        for b in due:
            # A group's first item in the queue is its oldest (each group's items keep their
            # arrival order): stop once every group of the bucket is seen.
            first_s: dict[Hashable | None, float] = {}
            for t in b.items:
                first_s.setdefault(t.item.group, t.item.arrival_s)
                if len(first_s) == len(b.groups):
                    break
            for g, arrival_s in first_s.items():
                key = (self._served.get(g, 0), arrival_s)
                if best is None or key < best[0]:
                    best = (key, b, g)
        assert best is not None
        return best[1], best[2]

    def next_deadline(self) -> float | None:
        """The earliest monotonic time at which a bucket is due (possibly in the past), or
        ``None`` when nothing is queued. Item deadlines are :meth:`next_expiry`'s.
        """
        due = min(self._due)
        return None if due == math.inf else due

    def next_expiry(self) -> float | None:
        """The earliest ``deadline_s`` of a queued item (monotonic seconds, possibly past), or
        ``None`` when no queued item has one. The engine wakes then, even with no free model
        slot, so :meth:`pop_ready` answers the item ``expired`` at its deadline instead of
        when a running batch ends. Amortized O(log n).
        """
        heap = self._deadlines
        while heap and id(heap[0][2]) not in self._queued_deadlines:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def cancel(
        self, predicate: Callable[[TokenizedItem], bool], now: float | None = None
    ) -> list[TokenizedItem]:
        """Remove and return the queued items for which ``predicate`` is true.

        ``now`` (monotonic seconds), when given, re-evaluates the adaptive rule of the buckets
        that lost items; without it their due time falls back to full/deadline.
        """
        removed: list[TokenizedItem] = []
        for b in self._buckets:
            if not b.items:
                continue
            keep: deque[TokenizedItem] = deque()
            for t in b.items:
                (removed if predicate(t) else keep).append(t)
            if len(keep) != len(b.items):
                b.items = keep
                b.recompute()
                if now is None:
                    self._due[b.index] = self._recompute_due_static(b)
                else:
                    self._update_due(b, now)
        self._account_removed(removed)
        return removed

    def cancel_group(self, group: Hashable, now: float | None = None) -> list[TokenizedItem]:
        """Remove and return the queued items whose ``item.group == group``."""
        self._served.pop(group, None)
        return self.cancel(lambda t: t.item.group == group, now)

    # -- internals -----------------------------------------------------------------------

    def _is_full(self, b: _Bucket) -> bool:
        n = len(b.items)
        return n >= self.config.max_batch_size or n * b.max_tokens >= self._budget_tokens

    def _recompute_due_static(self, b: _Bucket) -> float:
        """The due time without the adaptive rule (used where no ``now`` is at hand)."""
        if not b.items:
            return math.inf
        if self._is_full(b):
            return -math.inf
        return b.oldest_s + self.config.max_wait_s

    def _update_due(self, b: _Bucket, now: float) -> None:
        due = self._recompute_due_static(b)
        if self.config.adaptive_wait and now < due < math.inf:
            # Would the batch fill before its deadline at the current arrival rate?
            target = self.batch_capacity(max(b.max_tokens, 1))
            need = max(0, target - len(b.items))
            rate = b.rate_per_s(now, self.config.rate_window_s)
            fill_s = need / rate if rate > 0.0 else math.inf
            if now + fill_s > due:
                due = now  # cannot fill in time: do not wait for nothing
            elif self.measured and fill_s > self.cost.fixed_ms / 1000.0:
                due = now  # rule 8: a second batch costs less than waiting to fill this one
        self._due[b.index] = due

    def _form(self, b: _Bucket, now: float, *, deadline_flush: bool) -> Batch:
        """Pop one batch seeded by bucket ``b`` (its oldest items first).

        A deadline flush (``b`` not full) also takes neighbouring buckets' items while each
        merge pays for itself (:meth:`_merge_gain_tokens`), then trims to a preferred size.
        Every touched bucket's due time is updated.
        """
        cfg = self.config
        # ``plan``: (bucket, items taken from its FIFO head), in the order they joined.
        seed = self._head_that_fits(b, n_taken=0, padded=0)
        plan: list[tuple[_Bucket, list[TokenizedItem]]] = [(b, seed)]
        n_taken, padded = len(seed), max(t.n_tokens for t in seed)
        overhead = self._overhead_tokens()
        if deadline_flush and overhead > 0:
            used = {b.index}
            while True:
                best: tuple[int, _Bucket, list[TokenizedItem]] | None = None
                for c in self._merge_candidates(used):
                    head = self._head_that_fits(c, n_taken=n_taken, padded=padded)
                    gain = merge_gain_tokens(n_taken, padded, head, overhead) if head else 0
                    if gain > 0 and (best is None or gain > best[0]):
                        best = (gain, c, head)
                if best is None:
                    break
                _, c, head = best
                plan.append((c, head))
                used.add(c.index)
                n_taken += len(head)
                padded = max(padded, max(t.n_tokens for t in head))
        taken = [t for _, head in plan for t in head]
        if deadline_flush and cfg.preferred_batch_sizes:
            fits = [p for p in cfg.preferred_batch_sizes if p <= len(taken)]
            if fits and fits[-1] < len(taken):
                keep = fits[-1]
                plan = _trim_plan(plan, keep)
                taken = taken[:keep]
        for bucket, head in plan:
            bucket.pop_head(len(head))
        self._account_removed(taken)
        for bucket, _ in plan:
            self._update_due(bucket, now)
        taken.sort(key=lambda t: t.n_tokens, reverse=True)
        padded = max(t.n_tokens for t in taken)
        return Batch(items=taken, padded_len=padded, formed_s=now, bucket=b.index)

    def _head_that_fits(self, b: _Bucket, *, n_taken: int, padded: int) -> list[TokenizedItem]:
        """The longest FIFO head of ``b`` that a batch of ``n_taken`` items padded to
        ``padded`` tokens can still take under ``max_batch_size`` and ``max_batch_tokens``
        (at least one item when the batch is empty)."""
        cfg = self.config
        head: list[TokenizedItem] = []
        n = n_taken
        for t in b.items:
            new_padded = max(padded, t.n_tokens)
            if n >= cfg.max_batch_size or (n and new_padded * (n + 1) > self._budget_tokens):
                break
            head.append(t)
            n += 1
            padded = new_padded
        return head

    def _merge_candidates(self, used: set[int]) -> list[_Bucket]:
        """The nearest non-empty, not full bucket below and above the used ones."""
        lo, hi = min(used), max(used)
        out: list[_Bucket] = []
        for rng in (range(lo - 1, -1, -1), range(hi + 1, len(self._buckets))):
            for i in rng:
                c = self._buckets[i]
                if c.items and not self._is_full(c):
                    out.append(c)
                    break
        return out

    def _overhead_tokens(self) -> int:
        """Rule 5's fixed cost of a batch in padded tokens: ``batch_overhead_tokens``, or once
        measured (rule 8) :data:`MERGE_SHARE` of the fitted one when that is larger; 0 when
        ``batch_overhead_tokens`` is 0 (buckets never mix)."""
        configured = self.config.batch_overhead_tokens
        if configured == 0 or not self.measured:
            return configured
        return max(configured, round(MERGE_SHARE * self.cost.overhead_tokens))

    def _account_removed(self, removed: list[TokenizedItem]) -> None:
        self._queued_items -= len(removed)
        self._queued_tokens -= sum(t.n_tokens for t in removed)
        for t in removed:
            if t.item.deadline_s is not None:
                self._with_deadline -= 1
                self._queued_deadlines.discard(id(t))
        if not self._with_deadline:
            self._deadlines.clear()


def fit_budget(
    config: BatchPolicyConfig, cost: BatchCostModel, max_length: int, max_batch_ms: float | None
) -> int:
    """Rule 8's padded-token budget of a batch: ``max_batch_tokens``, lowered to what ``cost``
    says finishes within ``target_p99_ms / 2`` (once measured) and ``max_batch_ms`` (from the
    start, on the prior cost model until then: a prior for a CPU overestimates a GPU's cost,
    so bulk batches start small, never too long); never below one item of ``max_length``."""
    caps_ms: list[float] = []
    if config.target_p99_ms is not None and cost.batches >= MIN_FIT_BATCHES:
        caps_ms.append(config.target_p99_ms / 2.0)
    if max_batch_ms is not None:
        caps_ms.append(max_batch_ms)
    if not caps_ms:
        return config.max_batch_tokens
    fit = cost.tokens_within(min(caps_ms))
    return min(config.max_batch_tokens, max(max_length, fit))


def merge_gain_tokens(n: int, padded: int, head: list[TokenizedItem], overhead_tokens: int) -> int:
    """Padded tokens saved by running ``head`` inside a batch of ``n`` items padded to
    ``padded`` instead of on its own (rule 5; ``overhead_tokens``: a batch's fixed cost).

    Two batches cost ``2 × overhead + n·padded + m·padded_head``; one merged batch costs
    ``overhead + (n + m)·max(padded, padded_head)``. Positive = merging is cheaper (the
    cost model of the field report: a batch's time ≈ fixed cost + padded tokens).
    """
    m = len(head)
    p_head = max(t.n_tokens for t in head)
    merged = (n + m) * max(padded, p_head)
    separate = n * padded + m * p_head + overhead_tokens
    return separate - merged


def _overdue_at(now: float) -> Callable[[TokenizedItem], bool]:
    """Whether an item's ``deadline_s`` has passed at ``now`` (monotonic seconds)."""

    def overdue(t: TokenizedItem) -> bool:
        d = t.item.deadline_s
        return d is not None and d <= now

    return overdue


def _put_group_first(b: _Bucket, group: Hashable | None) -> None:
    """Reorder ``b``'s queue: the items of ``group`` first, each part in arrival order."""
    if b.items[0].item.group == group:
        return
    mine = [t for t in b.items if t.item.group == group]
    b.items = deque([*mine, *(t for t in b.items if t.item.group != group)])
    b.note_reordered()


def _trim_plan(
    plan: list[tuple[_Bucket, list[TokenizedItem]]], keep: int
) -> list[tuple[_Bucket, list[TokenizedItem]]]:
    """The first ``keep`` items of ``plan`` (each bucket still gives a FIFO head)."""
    out: list[tuple[_Bucket, list[TokenizedItem]]] = []
    for bucket, head in plan:
        if keep <= 0:
            break
        out.append((bucket, head[:keep]))
        keep -= len(head)
    return out
