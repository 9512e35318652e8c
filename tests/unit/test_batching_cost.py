"""BatchCostModel and the policy's rule 8 (measured batch cost), table tests on a fake clock."""

from __future__ import annotations

import math

import pytest

from consumer.batching.config import BatchPolicyConfig
from consumer.batching.cost import BatchCostModel
from consumer.batching.policy import MIN_FIT_BATCHES, BucketBatcher
from tests.unit.test_batching_policy import MS, cfg, ids, tok


@pytest.mark.parametrize(
    ("fixed_ms", "per_token_us", "sizes"),
    [
        (8.0, 120.0, [32, 256, 512, 1024, 2048]),  # CPU MiniLM-like
        (1.0, 0.445, [2048, 4096, 8192, 16384]),  # the simulated H200
        (0.0, 50.0, [100, 300, 900]),  # no fixed cost
    ],
)
def test_fit_recovers_an_affine_device(
    fixed_ms: float, per_token_us: float, sizes: list[int]
) -> None:
    m = BatchCostModel(prior_fixed_ms=3.0, prior_per_token_us=10.0)
    for _ in range(5):
        for n in sizes:
            m.observe(n, fixed_ms + per_token_us * n / 1000.0)
    assert m.fixed_ms == pytest.approx(fixed_ms, abs=1e-6)
    assert m.per_token_us == pytest.approx(per_token_us, rel=1e-6)
    assert m.predict_ms(1000) == pytest.approx(fixed_ms + per_token_us, rel=1e-6)


def test_one_batch_size_keeps_the_prior_fixed_cost() -> None:
    m = BatchCostModel(prior_fixed_ms=4.0, prior_per_token_us=1.0)
    for _ in range(20):
        m.observe(500, 14.0)  # no spread: slope fitted through the prior's intercept
    assert m.fixed_ms == 4.0
    assert m.per_token_us == pytest.approx(20.0)


def test_recent_batches_weigh_more() -> None:
    m = BatchCostModel(prior_fixed_ms=0.0, prior_per_token_us=1.0, half_life_batches=4)
    for _ in range(50):
        for n in (100, 1000):
            m.observe(n, 2.0 * n / 1000.0)  # 2 µs/token
    for _ in range(50):
        for n in (100, 1000):
            m.observe(n, 4.0 * n / 1000.0)  # the device slowed to 4 µs/token
    assert m.per_token_us == pytest.approx(4.0, rel=0.01)


@pytest.mark.parametrize(("tokens", "ms"), [(0, math.nan), (-5, 1.0), (100, -1.0), (100, math.inf)])
def test_nonsense_observations_are_ignored(tokens: int, ms: float) -> None:
    m = BatchCostModel()
    m.observe(tokens, ms)
    assert m.batches == 0 and m.fixed_ms == m.prior_fixed_ms


@pytest.mark.parametrize(
    ("budget_ms", "expected"),
    [(5.0, 0), (4.0, 0), (6.0, 1000), (15.0, 10_000)],
)
def test_tokens_within_a_budget(budget_ms: float, expected: int) -> None:
    m = BatchCostModel(prior_fixed_ms=5.0, prior_per_token_us=1.0)
    assert m.tokens_within(budget_ms) == expected


@pytest.mark.parametrize(
    "kw", [{"prior_fixed_ms": -1.0}, {"prior_per_token_us": 0.0}, {"half_life_batches": 0.5}]
)
def test_bad_priors_raise(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        BatchCostModel(**kw)


def measure(b: BucketBatcher, fixed_ms: float, per_token_us: float) -> None:
    """Feed the batcher MIN_FIT_BATCHES timings of an affine device (spread sizes)."""
    for k in range(MIN_FIT_BATCHES):
        tokens = 64 * (k + 1)
        b.observe_batch(tokens, fixed_ms + per_token_us * tokens / 1000.0)
    assert b.measured


# ---- rule 8 in the policy -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target_ms", "fixed_ms", "per_token_us", "budget"),
    [
        (None, 5.0, 100.0, 1024),  # no target: the configured budget
        (50.0, 5.0, 100.0, 200),  # 25 ms per batch: 20 ms of tokens at 100 µs
        (20.0, 5.0, 100.0, 64),  # 10 ms: 50 tokens, but never below one max-length item
        (1000.0, 5.0, 100.0, 1024),  # the target allows more than max_batch_tokens
    ],
)
def test_target_p99_sets_the_token_budget_from_the_measured_cost(
    target_ms: float | None, fixed_ms: float, per_token_us: float, budget: int
) -> None:
    b = BucketBatcher(cfg(target_p99_ms=target_ms, max_batch_size=64), max_length=64)
    assert b.budget_tokens == 1024  # nothing measured yet: no cap
    measure(b, fixed_ms, per_token_us)
    assert b.budget_tokens == budget
    for i in range(40):
        b.add(tok(i, 10), now=0.0)
    sizes = [len(x.items) for x in b.pop_ready(10 * MS).batches]
    assert all(n * 10 <= budget for n in sizes) and sum(sizes) == 40


def test_target_p99_full_bucket_leaves_at_once() -> None:
    b = BucketBatcher(cfg(target_p99_ms=50.0, max_batch_size=64), max_length=64)
    measure(b, 5.0, 100.0)  # budget 200 tokens = 20 items of 10
    for i in range(20):
        b.add(tok(i, 10), now=0.0)
    assert b.next_deadline() == -math.inf  # full under the lowered budget
    assert [len(x.items) for x in b.pop_ready(0.0).batches] == [20]


@pytest.mark.parametrize(
    ("fixed_ms", "waits"),
    [
        (5.0, True),  # filling takes ~3.5 ms < one batch's 5 ms fixed cost: worth waiting
        (1.0, False),  # a second batch (1 ms) is cheaper than waiting 3.5 ms: run now
    ],
)
def test_measured_fixed_cost_bounds_the_adaptive_wait(fixed_ms: float, waits: bool) -> None:
    config = cfg(adaptive_wait=True, max_batch_size=8, rate_window_ms=20.0)
    b = BucketBatcher(config, max_length=64)
    measure(b, fixed_ms, 10.0)
    # 1 item / 0.5 ms = 2000/s: 7 more items need ~3.5 ms < the 10 ms wait.
    for i in range(200):
        b.add(tok(i, 5, at_ms=i * 0.5), now=i * 0.5 * MS)
        b.pop_ready(i * 0.5 * MS)
    b.add(tok(999, 5, at_ms=100.0), now=100 * MS)
    due = b.next_deadline()
    assert due is not None
    assert (due > 100 * MS) is waits


@pytest.mark.parametrize(
    ("fixed_ms", "per_token_us", "expected"),
    [
        (0.1, 100.0, [[1], [2]]),  # 1 token of fixed cost: padding 10 → 40 costs more
        (20.0, 100.0, [[1, 2]]),  # 200 tokens of fixed cost: one batch is cheaper
    ],
)
def test_measured_fixed_cost_decides_bucket_merges(
    fixed_ms: float, per_token_us: float, expected: list[list[int]]
) -> None:
    b = BucketBatcher(cfg(batch_overhead_tokens=32), max_length=64)
    measure(b, fixed_ms, per_token_us)
    b.add(tok(1, 10), now=0.0)
    b.add(tok(2, 40), now=0.0)
    assert sorted(ids(b.pop_ready(10 * MS).batches)) == expected


def test_zero_overhead_still_never_mixes_after_measuring() -> None:
    b = BucketBatcher(cfg(batch_overhead_tokens=0), max_length=64)
    measure(b, 50.0, 1.0)
    b.add(tok(1, 10), now=0.0)
    b.add(tok(2, 40), now=0.0)
    assert sorted(ids(b.pop_ready(10 * MS).batches)) == [[1], [2]]


def test_target_p99_must_be_positive() -> None:
    with pytest.raises(ValueError, match="target_p99_ms"):
        BatchPolicyConfig(target_p99_ms=0.0)
