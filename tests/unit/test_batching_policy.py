"""BucketBatcher with a fake clock: deadlines from the first item, budgets, expiry, order."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from consumer.batching.config import DEFAULT_BUCKET_EDGES, BatchPolicyConfig
from consumer.batching.policy import BucketBatcher
from consumer.batching.types import InferenceItem, TokenizedItem

MS = 0.001


def tok(
    item_id: int,
    n: int,
    at_ms: float = 0.0,
    deadline_ms: float | None = None,
    group: str | None = None,
) -> TokenizedItem:
    item = InferenceItem(
        item_id=item_id,
        text="x",
        arrival_s=at_ms * MS,
        deadline_s=None if deadline_ms is None else deadline_ms * MS,
        group=group,
    )
    return TokenizedItem(item=item, input_ids=[1] * n, n_tokens=n, truncated=False)


def cfg(**kw: object) -> BatchPolicyConfig:
    base: dict[str, object] = {
        "max_batch_size": 8,
        "max_batch_tokens": 1024,
        "max_wait_ms": 10.0,
        "bucket_edges": (8, 16, 32, 64),
        "adaptive_wait": False,
    }
    base.update(kw)
    return BatchPolicyConfig.model_validate(base)


def ids(batches: list) -> list[list[int]]:  # type: ignore[type-arg]
    return [sorted(t.item.item_id for t in b.items) for b in batches]


def test_timer_starts_at_first_item_and_is_not_reset() -> None:
    b = BucketBatcher(cfg(), max_length=64)
    for i, at in enumerate((0.0, 3.0, 6.0)):
        b.add(tok(i, 5, at_ms=at), now=at * MS)
        assert b.next_deadline() == pytest.approx(10 * MS)  # never pushed back
    assert not b.pop_ready(9.999 * MS)
    ready = b.pop_ready(10 * MS)
    assert ids(ready.batches) == [[0, 1, 2]]
    assert b.queued_items == 0 and b.next_deadline() is None


def test_lone_item_leaves_at_its_deadline() -> None:
    b = BucketBatcher(cfg(max_wait_ms=25.0), max_length=64)
    b.add(tok(7, 20, at_ms=100.0), now=100 * MS)
    assert b.next_deadline() == pytest.approx(125 * MS)
    assert not b.pop_ready(124.9 * MS)
    ready = b.pop_ready(125 * MS)
    assert ids(ready.batches) == [[7]]
    assert ready.batches[0].padded_len == 20


@pytest.mark.parametrize(
    ("n_tokens", "budget", "max_size", "expected_sizes"),
    [
        (60, 240, 8, [4, 4, 2]),  # 4 × 60 = 240 fits exactly
        (60, 239, 8, [3, 3, 3, 1]),  # one token less: 3 per batch
        (5, 1024, 4, [4, 4, 2]),  # the size limit binds first
        (64, 64, 8, [1] * 10),  # one max-length item per batch
    ],
)
def test_token_budget_and_size_limit_hold(
    n_tokens: int, budget: int, max_size: int, expected_sizes: list[int]
) -> None:
    b = BucketBatcher(cfg(max_batch_tokens=budget, max_batch_size=max_size), max_length=64)
    for i in range(10):
        b.add(tok(i, n_tokens), now=0.0)
    ready = b.pop_ready(0.0, force=True)
    assert [len(x.items) for x in ready.batches] == expected_sizes
    for batch in ready.batches:
        assert batch.padded_tokens <= budget
        assert len(batch.items) <= max_size


def test_padded_len_is_the_longest_in_the_batch_and_mixed_lengths_respect_budget() -> None:
    b = BucketBatcher(cfg(max_batch_tokens=100, bucket_edges=(64,)), max_length=64)
    for i, n in enumerate([10, 30, 20, 30, 40]):
        b.add(tok(i, n), now=0.0)
    batches = b.pop_ready(0.0, force=True).batches
    # FIFO: 10, 30, 20 → padded 30 × 3 = 90; adding 30 → 120 > 100.
    assert ids(batches) == [[0, 1, 2], [3, 4]]
    assert [x.padded_len for x in batches] == [30, 40]
    assert all(x.padded_tokens <= 100 for x in batches)


def test_full_bucket_leaves_before_its_deadline() -> None:
    b = BucketBatcher(cfg(max_batch_size=4), max_length=64)
    for i in range(3):
        b.add(tok(i, 5, at_ms=i), now=i * MS)
    assert not b.pop_ready(3 * MS)
    b.add(tok(3, 5, at_ms=3), now=3 * MS)
    assert b.next_deadline() is not None and b.next_deadline() <= 3 * MS  # type: ignore[operator]
    assert ids(b.pop_ready(3 * MS).batches) == [[0, 1, 2, 3]]


def test_token_budget_fills_a_bucket() -> None:
    b = BucketBatcher(cfg(max_batch_tokens=128, max_batch_size=64), max_length=64)
    for i in range(3):
        b.add(tok(i, 40), now=0.0)  # 3 × 40 = 120 < 128: not full
    assert not b.pop_ready(0.0)
    b.add(tok(3, 40), now=0.0)  # 4 × 40 = 160 ≥ 128: full
    assert ids(b.pop_ready(0.0).batches) == [[0, 1, 2]]


def test_backlog_flushes_at_once() -> None:
    b = BucketBatcher(cfg(max_batch_size=8), max_length=64)
    for i in range(20):
        b.add(tok(i, 5), now=0.0)
    ready = b.pop_ready(0.0)
    assert [len(x.items) for x in ready.batches] == [8, 8]  # no waiting for full batches
    assert b.queued_items == 4
    assert not b.pop_ready(9.9 * MS)  # the remainder waits for its deadline
    assert [len(x.items) for x in b.pop_ready(10 * MS).batches] == [4]


def test_max_batches_limits_what_is_formed() -> None:
    b = BucketBatcher(cfg(max_batch_size=8), max_length=64)
    for i in range(24):
        b.add(tok(i, 5), now=0.0)
    assert len(b.pop_ready(0.0, max_batches=1).batches) == 1
    assert b.pop_ready(0.0, max_batches=0).batches == []
    assert b.queued_items == 16


@pytest.mark.parametrize(
    ("queued", "preferred", "expected_sizes"),
    [
        (7, (2, 4), [4, 2, 1]),
        (8, (2, 4), [8]),  # full: a size flush, not a deadline flush
        (5, (4,), [4, 1]),
        (3, (4,), [3]),  # nothing fits: take everything
        (6, (), [6]),
    ],
)
def test_preferred_sizes_on_a_deadline_flush(
    queued: int, preferred: tuple[int, ...], expected_sizes: list[int]
) -> None:
    b = BucketBatcher(cfg(preferred_batch_sizes=preferred), max_length=64)
    for i in range(queued):
        b.add(tok(i, 5), now=0.0)
    ready = b.pop_ready(10 * MS)
    assert [len(x.items) for x in ready.batches] == expected_sizes


def test_expired_items_are_returned_and_never_batched() -> None:
    b = BucketBatcher(cfg(batch_overhead_tokens=0), max_length=64)
    b.add(tok(1, 5, deadline_ms=5.0), now=0.0)
    b.add(tok(2, 5), now=0.0)
    b.add(tok(3, 20, deadline_ms=50.0), now=0.0)
    ready = b.pop_ready(10 * MS)
    assert [t.item.item_id for t in ready.expired] == [1]
    assert ids(ready.batches) == [[2], [3]]
    assert b.queued_items == 0 and b.queued_tokens == 0


def test_item_expired_while_waiting_in_a_full_backlog() -> None:
    b = BucketBatcher(cfg(max_batch_size=2), max_length=64)
    b.add(tok(1, 5, deadline_ms=1.0), now=0.0)
    b.add(tok(2, 5), now=0.0)
    b.add(tok(3, 5), now=0.0)
    ready = b.pop_ready(2 * MS)
    assert [t.item.item_id for t in ready.expired] == [1]
    assert ids(ready.batches) == [[2, 3]]


@pytest.mark.parametrize(
    ("n_tokens", "bucket"),
    [(1, 0), (8, 0), (9, 1), (16, 1), (17, 2), (32, 2), (33, 3), (48, 3)],
)
def test_bucket_choice(n_tokens: int, bucket: int) -> None:
    b = BucketBatcher(cfg(bucket_edges=(8, 16, 32, 64, 128)), max_length=48)
    assert b.edges == (8, 16, 32, 48)  # capped at the model's max length
    assert b.bucket_of(n_tokens) == bucket


@pytest.mark.parametrize("n_tokens", [0, 49])
def test_out_of_range_lengths_are_refused(n_tokens: int) -> None:
    b = BucketBatcher(cfg(), max_length=48)
    with pytest.raises(ValueError, match="n_tokens"):
        b.add(tok(0, n_tokens), now=0.0)


def test_buckets_do_not_mix_lengths_and_oldest_deadline_goes_first() -> None:
    b = BucketBatcher(cfg(), max_length=64)
    b.add(tok(1, 40, at_ms=0.0), now=0.0)
    b.add(tok(2, 5, at_ms=1.0), now=1 * MS)
    b.add(tok(3, 6, at_ms=2.0), now=2 * MS)
    ready = b.pop_ready(20 * MS)
    assert ids(ready.batches) == [[1], [2, 3]]  # earliest deadline first
    one = BucketBatcher(cfg(), max_length=64)
    one.add(tok(1, 40), now=0.0)
    one.add(tok(2, 5), now=0.0)
    assert sorted(x.padded_len for x in one.pop_ready(10 * MS).batches) == [5, 40]


def test_deadline_flush_merges_neighbours_when_the_padding_costs_less_than_a_batch() -> None:
    # 2 × 7 tokens (bucket ≤ 8) and 2 × 10 tokens (bucket ≤ 16): one batch padded to 10
    # computes 40 tokens, two batches 14 + 20 + one batch overhead (32) = 66.
    b = BucketBatcher(cfg(batch_overhead_tokens=32), max_length=64)
    for i, (n, at) in enumerate([(7, 0.0), (10, 1.0), (7, 2.0), (10, 3.0)]):
        b.add(tok(i, n, at_ms=at), now=at * MS)
    ready = b.pop_ready(10 * MS)
    assert ids(ready.batches) == [[0, 1, 2, 3]]
    assert ready.batches[0].padded_len == 10
    assert b.queued_items == 0 and b.next_deadline() is None


def test_no_merge_when_the_padding_costs_more_than_a_batch() -> None:
    # 8 + 60 tokens: merged = 2 × 60 = 120 > 8 + 60 + 32 = 100 → two batches.
    b = BucketBatcher(cfg(batch_overhead_tokens=32), max_length=64)
    b.add(tok(1, 8), now=0.0)
    b.add(tok(2, 60), now=0.0)
    assert ids(b.pop_ready(10 * MS).batches) == [[1], [2]]


def test_batch_overhead_zero_never_mixes_buckets() -> None:
    b = BucketBatcher(cfg(batch_overhead_tokens=0), max_length=64)
    b.add(tok(1, 7), now=0.0)
    b.add(tok(2, 9), now=0.0)
    assert ids(b.pop_ready(10 * MS).batches) == [[1], [2]]


def test_merge_respects_size_and_token_budget_and_takes_fifo_heads() -> None:
    # Bucket ≤ 8 holds 3 items, bucket ≤ 16 holds 4; max_batch_size 5 → the merged batch
    # takes the seed bucket's 3 and the neighbour's 2 oldest; the other 2 stay queued with
    # their own deadline (the oldest remaining arrival + max wait).
    b = BucketBatcher(cfg(batch_overhead_tokens=64, max_batch_size=5), max_length=64)
    for i in range(3):
        b.add(tok(i, 8, at_ms=float(i)), now=i * MS)
    for i in range(3, 7):
        b.add(tok(i, 12, at_ms=float(i)), now=i * MS)
    ready = b.pop_ready(10 * MS, max_batches=1)
    assert ids(ready.batches) == [[0, 1, 2, 3, 4]]
    assert b.queued_items == 2
    assert b.next_deadline() == pytest.approx(15 * MS)
    budget = BucketBatcher(cfg(batch_overhead_tokens=1000, max_batch_tokens=64), max_length=64)
    for i in range(4):
        budget.add(tok(i, 8), now=0.0)
    budget.add(tok(9, 30), now=0.0)
    for batch in budget.pop_ready(10 * MS).batches:
        assert batch.padded_tokens <= 64


def test_merge_never_takes_from_a_full_bucket() -> None:
    b = BucketBatcher(cfg(batch_overhead_tokens=1000, max_batch_size=2), max_length=64)
    b.add(tok(1, 7, at_ms=0.0), now=0.0)
    b.add(tok(2, 10, at_ms=1.0), now=1 * MS)
    b.add(tok(3, 10, at_ms=1.0), now=1 * MS)
    b.add(tok(4, 10, at_ms=1.0), now=1 * MS)  # bucket ≤ 16 is full (and due) twice over
    ready = b.pop_ready(1 * MS)
    assert ids(ready.batches) == [[2, 3]]  # the full bucket leaves; 1 and 4 are not full
    ready = b.pop_ready(10 * MS)
    assert ids(ready.batches) == [[1, 4]]  # now both are under-filled: one merged batch


def test_merge_then_preferred_size_keeps_the_oldest() -> None:
    b = BucketBatcher(cfg(batch_overhead_tokens=64, preferred_batch_sizes=(1, 2, 4)), max_length=64)
    for i, n in enumerate([7, 7, 10, 10, 10]):
        b.add(tok(i, n, at_ms=float(i)), now=i * MS)
    first = b.pop_ready(10 * MS, max_batches=1)
    assert ids(first.batches) == [[0, 1, 2, 3]]
    assert ids(b.pop_ready(20 * MS).batches) == [[4]]


def test_adaptive_wait_does_not_wait_under_sparse_traffic() -> None:
    b = BucketBatcher(cfg(adaptive_wait=True), max_length=64)
    b.add(tok(1, 5), now=0.0)  # no arrival history: cannot fill in 10 ms
    assert b.next_deadline() == 0.0
    assert ids(b.pop_ready(0.0).batches) == [[1]]


def test_adaptive_wait_waits_when_the_rate_fills_the_batch_in_time() -> None:
    config = cfg(adaptive_wait=True, max_batch_size=8, rate_window_ms=20.0)
    b = BucketBatcher(config, max_length=64)
    # 1 item / 0.5 ms = 2000/s: 7 more items need ~3.5 ms < 10 ms wait.
    for i in range(200):
        b.add(tok(i, 5, at_ms=i * 0.5), now=i * 0.5 * MS)
        b.pop_ready(i * 0.5 * MS)  # full batches leave as they fill
    b.add(tok(999, 5, at_ms=100.0), now=100 * MS)
    assert b.next_deadline() == pytest.approx(110 * MS)  # worth waiting


def test_cancel_group_removes_only_that_group() -> None:
    b = BucketBatcher(cfg(), max_length=64)
    b.add(tok(1, 5, group="a"), now=0.0)
    b.add(tok(2, 5, group="b"), now=0.0)
    b.add(tok(3, 40, group="a"), now=0.0)
    removed = b.cancel_group("a")
    assert sorted(t.item.item_id for t in removed) == [1, 3]
    assert b.queued_items == 1 and b.queued_tokens == 5
    assert ids(b.pop_ready(10 * MS).batches) == [[2]]


def test_worst_case_shapes_follow_the_budget() -> None:
    b = BucketBatcher(cfg(max_batch_tokens=256, max_batch_size=16), max_length=64)
    assert b.worst_case_shapes() == [(16, 8), (16, 16), (8, 32), (4, 64)]


def test_random_traffic_every_item_leaves_once_within_limits() -> None:
    rng = random.Random(7)
    config = cfg(max_batch_size=16, max_batch_tokens=512, bucket_edges=DEFAULT_BUCKET_EDGES)
    b = BucketBatcher(config, max_length=128)
    seen: list[int] = []
    now = 0.0

    def pop(at: float) -> None:
        for batch in b.pop_ready(at).batches:
            assert batch.padded_tokens <= 512 and len(batch.items) <= 16
            assert at - min(t.item.arrival_s for t in batch.items) <= 10 * MS + 1e-9
            seen.extend(t.item.item_id for t in batch.items)

    for i in range(2000):
        arrival = now + rng.expovariate(2000.0)
        # The driver wakes at every due time before the next arrival (as the engine does).
        while (due := b.next_deadline()) is not None and due <= arrival:
            now = max(now, due)
            pop(now)
        now = arrival
        b.add(tok(i, rng.randint(1, 128), at_ms=now / MS), now=now)
        pop(now)
    seen.extend(t.item.item_id for x in b.pop_ready(now, force=True).batches for t in x.items)
    assert sorted(seen) == list(range(2000))


@pytest.mark.parametrize(
    "bad",
    [
        {"bucket_edges": (16, 8)},
        {"bucket_edges": (0, 8)},
        {"preferred_batch_sizes": (4, 2)},
        {"preferred_batch_sizes": (64,), "max_batch_size": 32},
        {"max_wait_ms": -1.0},
        {"max_batch_size": 0},
        {"unknown_field": 1},
    ],
)
def test_config_rejects_bad_values(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        BatchPolicyConfig.model_validate(bad)


def test_config_is_frozen_and_checks_budget_against_max_length() -> None:
    c = BatchPolicyConfig()
    with pytest.raises(ValidationError):
        c.max_wait_ms = 5.0  # type: ignore[misc]
    assert c.max_wait_s == pytest.approx(c.max_wait_ms / 1000)
    with pytest.raises(ValueError, match="max_batch_tokens"):
        BucketBatcher(BatchPolicyConfig(max_batch_tokens=100), max_length=256)


def test_forming_a_batch_does_not_rescan_the_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    # A backlog of thousands in one bucket made every batch rescan all of it (O(n²) over a
    # drain: 4.5 M generator steps for 3000 batches of one). Taking a batch now updates the
    # bucket's aggregates from the items taken; a full rebuild happens only when it empties.
    from consumer.batching import policy

    rebuilds = []
    real = policy._Bucket.recompute
    monkeypatch.setattr(
        policy._Bucket, "recompute", lambda self: (rebuilds.append(1), real(self))[1]
    )
    b = BucketBatcher(cfg(max_batch_size=1, max_wait_ms=0.0), max_length=64)
    for i in range(200):
        b.add(tok(i, 3 + i % 5, at_ms=i * 0.01), now=0.0)
    for i in range(199):
        (batch,) = b.pop_ready(1.0, max_batches=1).batches
        assert batch.items[0].item.item_id == i  # FIFO, oldest first
    assert rebuilds == []
    (last,) = b.pop_ready(1.0).batches
    assert last.items[0].item.item_id == 199 and b.queued_items == 0


def test_incremental_bucket_aggregates_match_a_rebuild() -> None:
    rng = random.Random(7)
    b = BucketBatcher(cfg(max_batch_size=3, max_batch_tokens=96), max_length=64)
    t_ms = 0.0
    for i in range(300):
        t_ms += rng.choice([0.0, 0.5, 2.0])
        at = t_ms - rng.choice([0.0, 0.0, 0.0, 3.0])  # now and then an out-of-order arrival
        b.add(tok(i, rng.randint(1, 64), at_ms=at), now=t_ms * MS)
        if rng.random() < 0.4:
            b.pop_ready(t_ms * MS, max_batches=1, force=True)
        for bucket in b._buckets:
            kept = (bucket.tokens, bucket.max_tokens, bucket.oldest_s, dict(bucket.lengths))
            bucket.recompute()
            assert kept == (bucket.tokens, bucket.max_tokens, bucket.oldest_s, bucket.lengths)


@pytest.mark.parametrize(
    ("backlog_tokens", "short_tokens"),
    [
        (60, 5),  # a's long texts and b's short ones sit in different buckets
        (5, 5),  # the same bucket: b's items are behind a's backlog in it
    ],
)
def test_a_backlog_on_one_partition_does_not_starve_another(
    backlog_tokens: int, short_tokens: int
) -> None:
    # Regression: batches formed in arrival order across partitions, so a burst on one
    # partition held every other partition until it had drained. One model slot, each batch
    # takes 10 ms (fake clock): b is served at the first free slot after it is due.
    b = BucketBatcher(cfg(max_batch_size=4, max_batch_tokens=256), max_length=64)
    for i in range(40):
        b.add(tok(i, backlog_tokens, at_ms=0.0, group="a"), now=0.0)
    b.add(tok(100, short_tokens, at_ms=1.0, group="b"), now=1 * MS)
    b.add(tok(101, short_tokens, at_ms=1.0, group="b"), now=1 * MS)
    served_ms: dict[int, float] = {}
    order: list[str] = []
    at_ms = 10.0
    while b.queued_items:
        for batch in b.pop_ready(at_ms * MS, max_batches=1).batches:
            groups = {str(t.item.group) for t in batch.items}
            order.append("".join(sorted(groups)))
            served_ms.update((t.item.item_id, at_ms) for t in batch.items)
        at_ms += 10.0
    due_ms = 1.0 + 10.0  # b's arrival + max wait
    assert served_ms[100] <= due_ms + 10.0 and served_ms[101] <= due_ms + 10.0
    # The oldest first, then the partition not yet served (its batch may fill up with a's).
    assert order[0] == "a" and "b" in order[1]
    assert sorted(served_ms) == [*range(40), 100, 101]  # a's backlog still drains, once


def test_partitions_with_due_work_take_turns_oldest_first() -> None:
    b = BucketBatcher(cfg(max_batch_size=2, batch_overhead_tokens=0), max_length=64)
    for i, (group, n, at) in enumerate(
        [("a", 5, 0.0), ("a", 5, 0.0), ("a", 5, 0.0), ("a", 5, 0.0), ("b", 20, 2.0), ("c", 40, 1.0)]
    ):
        b.add(tok(i, n, at_ms=at, group=group), now=at * MS)
    groups = [
        next(str(t.item.group) for t in x.items)
        for x in (b.pop_ready(20 * MS, max_batches=1).batches[0] for _ in range(4))
    ]
    assert groups == ["a", "c", "b", "a"]  # never-served c (older) before b, then a again


def test_next_expiry_is_the_earliest_deadline_still_queued() -> None:
    b = BucketBatcher(cfg(max_wait_ms=1000.0), max_length=64)
    assert b.next_expiry() is None
    b.add(tok(1, 5, deadline_ms=50.0, group="a"), now=0.0)
    b.add(tok(2, 40, deadline_ms=30.0, group="b"), now=0.0)
    b.add(tok(3, 20), now=0.0)
    assert b.next_expiry() == pytest.approx(30 * MS)
    b.cancel_group("b")
    assert b.next_expiry() == pytest.approx(50 * MS)
    ready = b.pop_ready(50 * MS)  # expired at its deadline, though no bucket is due
    assert [t.item.item_id for t in ready.expired] == [1] and not ready.batches
    assert b.next_expiry() is None and b.queued_items == 1
