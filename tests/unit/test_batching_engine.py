"""The asyncio engine on a fake backend and a whitespace tokenizer: no torch, no timing."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence

import pytest

from consumer.batching.config import BatchPolicyConfig
from consumer.batching.engine import Engine, EngineClosedError
from consumer.batching.stats import EngineStats
from consumer.batching.types import InferenceItem, ItemOutcome, Rejected, TokenizedItem
from consumer.model.batch_runner import ModelRunner
from consumer.model.protocol import FakeBackend
from schemas.errors import ErrorCode


class WordTokenizer:
    """n words → [101, word ids…, 102]; over max_length: truncate or reject."""

    def __init__(self, max_length: int = 64) -> None:
        self.max_length = max_length

    def tokenize(self, items: Sequence[InferenceItem]) -> list[TokenizedItem | Rejected]:
        out: list[TokenizedItem | Rejected] = []
        for it in items:
            ids = [101, *(1000 + len(w) for w in it.text.split()), 102]
            if len(ids) > self.max_length:
                if it.truncate is False:
                    out.append(Rejected(it, len(ids), ErrorCode.INPUT_TOO_LONG, "too long"))
                    continue
                ids = [*ids[: self.max_length - 1], 102]
                out.append(TokenizedItem(it, ids, len(ids), truncated=True))
            else:
                out.append(TokenizedItem(it, ids, len(ids), truncated=False))
        return out


class Harness:
    def __init__(
        self, backend: FakeBackend, batch_timeout_s: float = 60.0, **config: object
    ) -> None:
        self.backend = backend
        self.stats = EngineStats()
        self.outcomes: dict[int, ItemOutcome] = {}
        self.duplicates = 0
        base: dict[str, object] = {"max_wait_ms": 0.0, "bucket_edges": (8, 16, 32, 64)}
        base.update(config)
        self.engine = Engine(
            ModelRunner(backend, stats=self.stats),
            WordTokenizer(backend.max_length),
            BatchPolicyConfig.model_validate(base),
            self.on_outcomes,
            stats=self.stats,
            batch_timeout_s=batch_timeout_s,
        )

    def on_outcomes(self, outcomes: list[ItemOutcome]) -> None:
        for o in outcomes:
            self.on_outcome(o)

    def on_outcome(self, o: ItemOutcome) -> None:
        if o.item_id in self.outcomes:
            self.duplicates += 1
        self.outcomes[o.item_id] = o


def items(texts: Sequence[str], start: int = 0, **kw: object) -> list[InferenceItem]:
    now = time.monotonic()
    return [
        InferenceItem(item_id=start + i, text=t, arrival_s=now, **kw)  # type: ignore[arg-type]
        for i, t in enumerate(texts)
    ]


TEXTS = ["a b c", "hello", "one two three four five six seven eight nine ten eleven", "x " * 40]


async def test_every_item_is_answered_once_with_its_own_result() -> None:
    h = Harness(FakeBackend(max_length=64))
    await h.engine.start()
    counts = await h.engine.submit(items(TEXTS * 10))
    assert counts[:4] == [5, 3, 13, 42]
    assert await h.engine.drain(timeout_s=30)
    await h.engine.stop()
    assert len(h.outcomes) == 40 and h.duplicates == 0
    assert {o.status for o in h.outcomes.values()} == {"ok"}
    solo = FakeBackend(max_length=64)
    for o in h.outcomes.values():
        text = TEXTS[o.item_id % 4]
        ids = WordTokenizer().tokenize(items([text]))[0]
        assert isinstance(ids, TokenizedItem)
        assert o.result == solo._answer(ids.input_ids)  # batch-independent
        assert o.n_tokens == ids.n_tokens and o.padded_len >= o.n_tokens
    assert h.stats.items == 40 and h.stats.padded_tokens >= h.stats.real_tokens


async def test_batches_never_mix_buckets_and_respect_limits() -> None:
    h = Harness(
        FakeBackend(max_length=64),
        max_batch_size=4,
        max_batch_tokens=128,
        bucket_edges=(4, 8, 16, 64),
    )
    await h.engine.start()
    await h.engine.submit(items(TEXTS * 10))
    assert await h.engine.drain(timeout_s=30)
    await h.engine.stop()
    for size, padded in h.backend.calls:
        assert size <= 4 and size * padded <= 128
    assert sorted({p for _, p in h.backend.calls}) == [3, 5, 13, 42]


async def test_expired_items_are_answered_and_never_computed() -> None:
    h = Harness(FakeBackend(max_length=64))
    await h.engine.start()
    past = time.monotonic() - 1.0
    await h.engine.submit(items(["late"], start=0, deadline_s=past))
    await h.engine.submit(items(["on time"], start=1, deadline_s=time.monotonic() + 3600))
    assert await h.engine.drain(timeout_s=30)
    await h.engine.stop()
    assert h.outcomes[0].status == "expired"
    assert h.outcomes[0].error_code == ErrorCode.DEADLINE_EXCEEDED
    assert h.outcomes[1].status == "ok"
    assert 0 not in h.backend.computed and h.stats.expired == 1


async def test_input_too_long_is_rejected_when_truncate_is_false() -> None:
    h = Harness(FakeBackend(max_length=16))
    await h.engine.start()
    long = "w " * 30
    await h.engine.submit(items([long], start=0, truncate=False))
    await h.engine.submit(items([long], start=1))
    assert await h.engine.drain(timeout_s=30)
    await h.engine.stop()
    assert h.outcomes[0].status == "error"
    assert h.outcomes[0].error_code == ErrorCode.INPUT_TOO_LONG
    assert h.outcomes[1].status == "ok" and h.outcomes[1].truncated
    assert h.outcomes[1].n_tokens == 16


async def test_a_failing_item_is_isolated_by_splitting() -> None:
    h = Harness(FakeBackend(max_length=64, fail_item_ids=[5]), max_wait_ms=60_000.0)
    await h.engine.start()
    await h.engine.submit(items(["same length"] * 8))
    await h.engine.flush()
    assert await h.engine.drain(timeout_s=30)
    await h.engine.stop()
    assert h.outcomes[5].status == "error"
    assert h.outcomes[5].error_code == ErrorCode.INFERENCE_FAILED
    assert all(h.outcomes[i].status == "ok" for i in range(8) if i != 5)
    assert h.stats.splits == 3 and h.stats.failed == 1  # 8 → 4 → 2 → 1


async def test_out_of_memory_splits_and_still_answers_all() -> None:
    backend = FakeBackend(max_length=64, oom_above_padded_tokens=20)
    h = Harness(backend, max_wait_ms=60_000.0, max_batch_tokens=1024)
    h.engine._warmup = "none"  # the budget is too large on purpose
    await h.engine.start()
    await h.engine.submit(items(["a b c"] * 16))  # 16 × 5 = 80 padded tokens
    await h.engine.flush()
    assert await h.engine.drain(timeout_s=30)
    await h.engine.stop()
    assert {o.status for o in h.outcomes.values()} == {"ok"} and len(h.outcomes) == 16
    assert h.stats.splits >= 2
    assert max(n for n, _ in backend.calls if n * 5 <= 20) == 4


async def test_warm_up_lowers_a_budget_the_device_cannot_hold(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = FakeBackend(max_length=64, oom_above_padded_tokens=300)
    h = Harness(backend, max_batch_tokens=2048)
    with caplog.at_level(logging.WARNING):
        await h.engine.start()
    await h.engine.stop()
    assert h.engine.policy_config.max_batch_tokens == 256
    assert "lowering" in caplog.text
    assert (4, 64) in backend.warmups  # worst case of the last bucket under 256 tokens


async def test_warm_up_fails_when_one_item_does_not_fit() -> None:
    h = Harness(FakeBackend(max_length=64, oom_above_padded_tokens=10))
    with pytest.raises(RuntimeError, match="does not fit"):
        await h.engine.start()


async def test_flush_forms_batches_without_waiting() -> None:
    h = Harness(FakeBackend(max_length=64), max_wait_ms=60_000.0, adaptive_wait=False)
    await h.engine.start()
    await h.engine.submit(items(["a b", "c d"]))
    assert h.engine.queued_items == 2 and h.engine.queued_tokens == 8
    await h.engine.flush()
    assert await h.engine.drain(timeout_s=30)
    await h.engine.stop()
    assert len(h.outcomes) == 2 and h.backend.calls == [(2, 4)]


async def test_cancel_group_drops_queued_items_only() -> None:
    h = Harness(FakeBackend(max_length=64), max_wait_ms=60_000.0, adaptive_wait=False)
    await h.engine.start()
    await h.engine.submit(items(["a", "b"], start=0, group=("t", 0)))
    await h.engine.submit(items(["c"], start=10, group=("t", 1)))
    assert sorted(h.engine.cancel_group(("t", 0))) == [0, 1]
    await h.engine.flush()
    assert await h.engine.drain(timeout_s=30)
    await h.engine.stop()
    assert sorted(h.outcomes) == [10]


async def test_watchdog_marks_a_hung_batch_unhealthy_until_it_returns() -> None:
    gate = threading.Event()
    tripped = asyncio.Event()
    h = Harness(FakeBackend(max_length=64, gate=gate), batch_timeout_s=0.05)
    stats_trip = h.stats.on_watchdog

    def on_watchdog() -> None:
        stats_trip()
        tripped.set()

    h.stats.on_watchdog = on_watchdog  # type: ignore[method-assign]
    await h.engine.start()
    await h.engine.submit(items(["hang"]))
    await asyncio.wait_for(tripped.wait(), timeout=30)
    assert not h.engine.healthy
    gate.set()
    assert await h.engine.drain(timeout_s=30)
    assert h.engine.healthy and h.outcomes[0].status == "ok"
    await h.engine.stop()
    assert not h.engine.healthy  # stopped


async def test_submit_requires_a_started_engine() -> None:
    h = Harness(FakeBackend(max_length=64))
    with pytest.raises(EngineClosedError):
        await h.engine.submit(items(["x"]))
    await h.engine.start()
    await h.engine.stop()
    await h.engine.stop()  # idempotent
    with pytest.raises(EngineClosedError):
        await h.engine.submit(items(["x"]))


async def test_a_raising_callback_does_not_stop_the_engine() -> None:
    seen: list[int] = []

    def on_outcomes(outcomes: list[ItemOutcome]) -> None:
        seen.extend(o.item_id for o in outcomes)
        raise RuntimeError("callback bug")

    backend = FakeBackend(max_length=64)
    engine = Engine(
        ModelRunner(backend), WordTokenizer(), BatchPolicyConfig(max_wait_ms=0.0), on_outcomes
    )
    await engine.start()
    await engine.submit(items(["a", "b c"]))
    await engine.submit(items(["d"], start=2))
    assert await engine.drain(timeout_s=30)
    await engine.stop()
    assert sorted(seen) == [0, 1, 2]


async def test_the_next_batch_starts_before_a_batchs_outcomes_go_out() -> None:
    # On a CPU (one model slot) the model should not wait while outcomes are turned into
    # replies: when the first batch's outcomes are emitted, the second is already launched.
    h = Harness(FakeBackend(max_length=64), max_batch_size=2)
    in_pipeline_at_emit: list[int] = []
    record = h.on_outcome

    def on_outcome(o: ItemOutcome) -> None:
        in_pipeline_at_emit.append(h.engine._in_pipeline)
        record(o)

    h.engine._on_outcomes = lambda outcomes: [on_outcome(o) for o in outcomes]
    await h.engine.start()
    await h.engine.submit(items(["a b", "c d", "e f", "g h"]))
    assert await h.engine.drain(timeout_s=30)
    assert len(h.outcomes) == 4  # drain returns only once every outcome is out
    assert in_pipeline_at_emit[:2] == [1, 1]  # batch 2 running while batch 1 is answered
    await h.engine.stop()


async def test_a_queued_item_expires_at_its_deadline_while_a_batch_holds_the_model() -> None:
    # Regression: with the only model slot busy and no other arrival, an item whose deadline
    # passed was answered expired only when the running batch ended.
    gate = threading.Event()
    h = Harness(FakeBackend(max_length=64, gate=gate), max_wait_ms=0.0)
    expired = asyncio.Event()
    record = h.on_outcome

    def on_outcome(o: ItemOutcome) -> None:
        record(o)
        if o.status == "expired":
            expired.set()

    h.engine._on_outcomes = lambda outcomes: [on_outcome(o) for o in outcomes]
    await h.engine.start()
    try:
        await h.engine.submit(items(["long batch"]))  # runs, held by the gate
        deadline_s = time.monotonic() + 0.2
        await h.engine.submit(items(["short"], start=1, deadline_s=deadline_s))
        await asyncio.wait_for(expired.wait(), timeout=10)
        assert time.monotonic() >= deadline_s
        assert not gate.is_set() and 0 not in h.outcomes  # the batch is still running
        assert h.outcomes[1].error_code == ErrorCode.DEADLINE_EXCEEDED
    finally:
        gate.set()
    assert await h.engine.drain(timeout_s=30)
    await h.engine.stop()
    assert h.outcomes[0].status == "ok" and 1 not in h.backend.computed


async def test_every_unsplit_batch_feeds_the_policy_cost_model() -> None:
    """Rule 8: the runner's timing of each batch reaches ``BucketBatcher.observe_batch``."""
    h = Harness(FakeBackend(max_length=64), max_batch_size=4)
    await h.engine.start()
    await h.engine.submit(items(TEXTS * 10))
    assert await h.engine.drain(timeout_s=30)
    await h.engine.stop()
    cost = h.engine._batcher.cost
    assert cost.batches == h.stats.batches == len(h.backend.calls) >= 10
    assert cost.fixed_ms >= 0 and cost.per_token_us > 0


async def test_a_small_chunk_tokenizes_on_the_loop_and_a_large_one_in_the_tokenizer_thread() -> (
    None
):
    """A thread hop costs more than tokenizing a few short texts
    (:data:`consumer.batching.engine.INLINE_TOKENIZE_CHARS`)."""
    from consumer.batching.engine import INLINE_TOKENIZE_CHARS

    h = Harness(FakeBackend(max_length=64))
    threads: list[str] = []
    tokenize = h.engine._tokenizer.tokenize

    def recording(chunk: Sequence[InferenceItem]) -> list[TokenizedItem | Rejected]:
        threads.append(threading.current_thread().name)
        return tokenize(chunk)

    h.engine._tokenizer.tokenize = recording  # type: ignore[method-assign,assignment]
    await h.engine.start()
    small = ["w " * 10] * 4  # 80 characters
    large = ["w " * 20] * (INLINE_TOKENIZE_CHARS // 40 + 1)  # just over the limit
    await h.engine.submit(items(small))
    await h.engine.submit(items(large, start=len(small)))
    assert await h.engine.drain(timeout_s=30)
    await h.engine.stop()
    assert threads[0] == threading.current_thread().name
    assert threads[1].startswith("kbatch-tokenize")
    assert len(h.outcomes) == len(small) + len(large)
    assert all(o.status == "ok" for o in h.outcomes.values())
