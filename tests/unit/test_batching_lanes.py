"""Lanes: the pure LaneScheduler, a fake-clock device simulation of both lanes, the bulk
batch-time cap, and the engine's lane handling on a gated fake backend."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from consumer.batching.config import BatchPolicyConfig
from consumer.batching.lanes import BULK_FIXED_COST_MULTIPLE, LaneScheduler
from consumer.batching.policy import MIN_FIT_BATCHES, BucketBatcher
from consumer.batching.types import InferenceItem, ItemOutcome, Lane, TokenizedItem
from consumer.model.protocol import FakeBackend
from tests.fakes import FakeClock
from tests.unit.test_batching_engine import Harness, items

# -- the scheduler's decision table ----------------------------------------------------------


@pytest.mark.parametrize(
    ("live_due", "bulk_due", "free", "in_pipeline", "owed", "expected"),
    [
        (True, False, 1, 0, False, "live"),
        (True, True, 1, 0, False, "live"),  # a ready live batch goes first
        (False, True, 1, 0, False, "bulk"),  # bulk fills an idle device
        (False, True, 1, 1, False, None),  # ...but never queues behind a running batch
        (True, True, 0, 1, False, None),  # no free slot
        (True, True, 1, 1, True, "bulk"),  # below its minimum share: bulk's turn
        (False, True, 1, 1, True, "bulk"),
        (True, False, 1, 1, True, "live"),  # owed but nothing due
        (False, False, 2, 0, True, None),
    ],
)
def test_next_lane_table(
    live_due: bool, bulk_due: bool, free: int, in_pipeline: int, owed: bool, expected: Lane | None
) -> None:
    s = LaneScheduler(bulk_min_share=0.1, share_window_s=5.0)
    s.note_batch("live", 100.0, now=1.0)
    if not owed:
        s.note_batch("bulk", 50.0, now=1.0)
    assert s.bulk_owed() is owed
    got = s.next_lane(
        live_due=live_due, bulk_due=bulk_due, free_slots=free, in_pipeline=in_pipeline
    )
    assert got == expected


@pytest.mark.parametrize(
    ("batches", "share"),
    [
        ([], 1.0),  # nothing run: nothing owed
        ([("live", 90.0, 0.0), ("bulk", 10.0, 0.0)], 0.1),
        # the older live time decays by e^-1 over one window: 10 / (10 + 90/e)
        ([("live", 90.0, 0.0), ("bulk", 10.0, 5.0)], 10.0 / (10.0 + 90.0 / 2.718281828)),
        ([("bulk", -1.0, 0.0), ("live", 10.0, 0.0)], 0.0),  # a negative time is ignored
    ],
)
def test_bulk_share_is_decayed_device_time(
    batches: list[tuple[Lane, float, float]], share: float
) -> None:
    s = LaneScheduler(bulk_min_share=0.1, share_window_s=5.0)
    for lane, ms, now in batches:
        s.note_batch(lane, ms, now)
    assert s.bulk_share() == pytest.approx(share, rel=1e-6)


def test_min_share_zero_never_owes_and_bad_settings_raise() -> None:
    s = LaneScheduler(bulk_min_share=0.0, share_window_s=1.0)
    s.note_batch("live", 1000.0, 0.0)
    assert not s.bulk_owed()
    assert s.next_lane(live_due=False, bulk_due=True, free_slots=1, in_pipeline=1) is None
    with pytest.raises(ValueError, match="bulk_min_share"):
        LaneScheduler(bulk_min_share=1.0, share_window_s=1.0)


@pytest.mark.parametrize(
    ("live_batches", "fixed_ms", "now", "cap_ms"),
    [
        ([], 20.0, 0.0, None),  # no live batch yet: nothing to protect, full bulk batches
        ([(30.0, 0.0)], 20.0, 0.1, 80.0),  # 4 × the fixed cost beats a short live batch
        ([(120.0, 0.0)], 20.0, 0.1, 120.0),  # a live batch's own time, when longer
        ([(30.0, 0.0)], 1.0, 0.1, 30.0),  # a launch-bound device: the live batch time
        ([(30.0, 0.0)], 20.0, 59.0, 80.0),  # sparse live traffic still counts as live
        ([(30.0, 0.0)], 20.0, 60.01, None),  # no live batch for a minute: no cap
        # the live mean is an EWMA: 30, then 16 batches of 130 → 130 - 100 × (15/16)^16
        (
            [(30.0, 0.0)] + [(130.0, 0.01 * i) for i in range(1, 17)],
            1.0,
            0.2,
            130.0 - 100.0 * (15 / 16) ** 16,
        ),
    ],
)
def test_the_automatic_bulk_cap(
    live_batches: list[tuple[float, float]], fixed_ms: float, now: float, cap_ms: float | None
) -> None:
    s = LaneScheduler(bulk_min_share=0.1, share_window_s=5.0)
    for ms, t in live_batches:
        s.note_batch("live", ms, t)
    s.note_batch("bulk", 500.0, now)  # bulk batches never count as live work
    got = s.bulk_cap_ms(fixed_ms, now)
    assert got == (None if cap_ms is None else pytest.approx(cap_ms, rel=1e-9))
    assert BULK_FIXED_COST_MULTIPLE == 4.0


def test_an_unset_cap_falls_back_to_the_full_budget() -> None:
    cfg = BatchPolicyConfig(max_batch_tokens=4096, bucket_edges=(32,))
    b = BucketBatcher(cfg, 32)
    b.set_max_batch_ms(20.0)
    assert b.budget_tokens == (20_000 - 3840) // 120  # the prior's fit of 20 ms
    b.set_max_batch_ms(None)
    assert b.budget_tokens == 4096


# -- a fake-clock device: both lanes through the scheduler -----------------------------------

FIXED_MS, PER_TOKEN_US = 5.0, 100.0


def _tok(item_id: int, n: int, arrival_s: float, lane: Lane) -> TokenizedItem:
    item = InferenceItem(item_id, "x", arrival_s=arrival_s, lane=lane)
    return TokenizedItem(item, [1] * n, n, truncated=False)


def _simulate(
    *,
    live_every_s: float | None,
    bulk_backlog: int,
    min_share: float,
    until_s: float,
    fixed_ms: float = 5.0,
    auto_cap: bool = False,
) -> dict[str, Any]:
    """One device (batch time = ``fixed_ms`` + 100 µs per padded token, depth 1), a live item
    of 20 tokens every ``live_every_s`` and a bulk backlog of 30-token items; bulk batches
    capped at 20 ms, or, ``auto_cap``, as the engine does when ``bulk_max_batch_ms`` is unset.
    Returns per-lane batch counts and device ms, the batches' lanes, each live item's wait
    beyond its bucket's due time, and the bulk caps used."""
    clock = FakeClock()
    cap = None if auto_cap else 20.0
    cfg = BatchPolicyConfig(
        max_wait_ms=2.0, bucket_edges=(32,), bulk_min_share=min_share, bulk_max_batch_ms=cap
    )
    live, bulk = BucketBatcher(cfg, 32), BucketBatcher(cfg, 32, max_batch_ms=cap)
    sched = LaneScheduler(cfg.bulk_min_share, cfg.lane_share_window_s)
    t0 = clock.now_s
    for i in range(bulk_backlog):
        bulk.add(_tok(-1 - i, 30, t0, "bulk"), t0)
    next_live = t0 if live_every_s is not None else float("inf")
    n_live = 0
    out: dict[str, Any] = {
        "lanes": [],
        "device_ms": {"live": 0.0, "bulk": 0.0},
        "late_ms": [],
        "bulk_ms": [],
        "caps_ms": [],
    }
    running: tuple[Lane, float] | None = None  # (lane, ends at)
    step = 0.0005
    while clock.now_s < t0 + until_s:
        now = clock.now_s
        while next_live <= now:
            live.add(_tok(n_live, 20, next_live, "live"), next_live)
            n_live += 1
            next_live += live_every_s or float("inf")
        if running is not None and running[1] <= now:
            running = None
        if running is None:
            due = {
                "live": live.queued_items > 0 and (live.next_deadline() or 1e18) <= now,
                "bulk": bulk.queued_items > 0 and (bulk.next_deadline() or 1e18) <= now,
            }
            lane = sched.next_lane(
                live_due=due["live"], bulk_due=due["bulk"], free_slots=1, in_pipeline=0
            )
            if lane is not None:
                batcher = live if lane == "live" else bulk
                (batch,) = batcher.pop_ready(now, max_batches=1).batches
                assert {t.item.lane for t in batch.items} == {lane}  # lanes never mix
                ms = fixed_ms + PER_TOKEN_US * batch.padded_tokens / 1000.0
                for b in (live, bulk):
                    b.observe_batch(batch.padded_tokens, ms)
                sched.note_batch(lane, ms, now + ms / 1000.0)
                if lane == "bulk":
                    out["bulk_ms"].append(ms)
                if auto_cap and bulk.measured:  # the engine's rule (lanes.py rule 2)
                    bulk.set_max_batch_ms(sched.bulk_cap_ms(bulk.cost.fixed_ms, now + ms / 1e3))
                    out["caps_ms"].append(bulk.max_batch_ms)
                out["lanes"].append(lane)
                out["device_ms"][lane] += ms
                if lane == "live":  # waited past the due time by at most the batch before
                    due_s = min(t.item.arrival_s for t in batch.items) + cfg.max_wait_s
                    out["late_ms"].append((now - due_s) * 1000.0)
                running = (lane, now + ms / 1000.0)
        clock.now_s = round(now + step, 6)
    return out


def test_bulk_fills_idle_capacity_and_delays_live_by_at_most_one_bulk_batch() -> None:
    # live at ~25 % load (a 7 ms batch every 28 ms), a long bulk backlog, no minimum share
    out = _simulate(live_every_s=0.028, bulk_backlog=5_000, min_share=0.0, until_s=3.0)
    assert out["lanes"].count("bulk") > out["lanes"].count("live") > 50
    # a live batch waits past its due time for at most one bulk batch (≤ 20 ms: the prior
    # cost model caps it until the fit takes over), + the adaptive wait's 2 ms and a clock step
    assert max(out["late_ms"]) <= 20.0 + 2.0 + 0.5


def test_the_automatic_cap_bounds_bulk_batches_by_the_fixed_cost_and_live_batches() -> None:
    # a CPU-like device (20 ms fixed): live at ~25 % load, bulk backlog, no minimum share
    out = _simulate(
        live_every_s=0.1, bulk_backlog=5_000, min_share=0.0, until_s=4.0, fixed_ms=20.0,
        auto_cap=True,
    )  # fmt: skip
    # the first second: the fit's first batches (full bulk ones: no live batch seen yet)
    late = out["late_ms"][10:]
    caps = [c for c in out["caps_ms"][20:] if c is not None]
    # the cap settles at 4 × the fitted fixed cost (live batches of one 20-token item: 22 ms)
    assert caps and all(78.0 <= c <= 82.0 for c in caps)
    # so a live batch waits behind at most one bulk batch of ≤ ~80 ms (+ wait, clock step)
    assert max(late) <= 82.0 + 2.0 + 0.5
    # and bulk batches spend ≤ ~1/4 of their time on the fixed cost once capped
    assert min(out["bulk_ms"][20:]) >= 4 * 20.0 - 4.0


def test_with_no_live_work_bulk_runs_full_batches() -> None:
    out = _simulate(
        live_every_s=None, bulk_backlog=3_000, min_share=0.0, until_s=2.0, fixed_ms=20.0,
        auto_cap=True,
    )  # fmt: skip
    assert out["lanes"] and set(out["lanes"]) == {"bulk"}
    assert set(out["caps_ms"]) == {None}
    # full batches: max_batch_size 64 items of 30 tokens (1920 padded tokens ≤ 2048)
    assert max(out["bulk_ms"]) == pytest.approx(20.0 + PER_TOKEN_US * 64 * 30 / 1000.0)


def test_min_share_keeps_bulk_from_starving_under_saturating_live() -> None:
    # live arrives faster than the device drains it: without a share bulk would never run
    starved = _simulate(live_every_s=0.0002, bulk_backlog=500, min_share=0.0, until_s=1.0)
    assert starved["lanes"].count("bulk") <= 1  # at most the one batch of the idle start
    fed = _simulate(live_every_s=0.0002, bulk_backlog=500, min_share=0.2, until_s=1.0)
    share = fed["device_ms"]["bulk"] / sum(fed["device_ms"].values())
    assert 0.15 <= share <= 0.3


def test_bulk_batches_are_capped_by_measured_time() -> None:
    cfg = BatchPolicyConfig(max_batch_tokens=4096, bucket_edges=(32,))
    b = BucketBatcher(cfg, 32, max_batch_ms=20.0)
    for _ in range(MIN_FIT_BATCHES):
        b.observe_batch(1000, FIXED_MS + PER_TOKEN_US * 1000 / 1000.0)
        b.observe_batch(2000, FIXED_MS + PER_TOKEN_US * 2000 / 1000.0)
    # (20 - 5) ms / 100 µs = 150 padded tokens
    assert b.budget_tokens == pytest.approx(150, abs=2)
    assert BucketBatcher(cfg, 32).budget_tokens == 4096  # no cap: the configured budget
    # before any batch the prior (32 tokens × 120 µs fixed, 120 µs/token) caps it already
    assert BucketBatcher(cfg, 32, max_batch_ms=20.0).budget_tokens == (20_000 - 3840) // 120


# -- the engine ------------------------------------------------------------------------------


class LaneSpy(FakeBackend):
    """Records each forward's lanes (in order)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.lanes: list[set[Lane]] = []

    def forward(self, prepared: object) -> list[dict[str, Any]]:
        assert isinstance(prepared, tuple)
        self.lanes.append({t.item.lane for t in prepared[0]})
        return super().forward(prepared)


async def _wait_calls(backend: FakeBackend, n: int) -> None:
    async with asyncio.timeout(10):
        while len(backend.calls) < n:
            await asyncio.sleep(0.001)


async def test_engine_runs_a_ready_live_batch_before_queued_bulk_and_never_mixes() -> None:
    gate = threading.Event()
    backend = LaneSpy(max_length=64, gate=gate)
    h = Harness(backend, bulk_min_share=0.0, max_batch_size=4)
    await h.engine.start()
    await h.engine.submit(items(["a b"] * 4, start=0, lane="bulk"))  # runs, held by the gate
    await _wait_calls(backend, 1)
    await h.engine.submit(items(["a b"] * 8, start=10, lane="bulk"))
    await h.engine.submit(items(["a b"] * 2, start=100))  # live, ready at once (max_wait 0)
    assert h.engine.queued_items_of("bulk") == 8 and h.engine.queued_items_of("live") == 2
    gate.set()
    assert await h.engine.drain(timeout_s=10)
    await h.engine.stop()
    assert backend.lanes == [{"bulk"}, {"live"}, {"bulk"}, {"bulk"}]
    assert len(h.outcomes) == 14 and {o.status for o in h.outcomes.values()} == {"ok"}
    # The engine accounts both lanes' device time (the arithmetic is
    # test_bulk_share_is_decayed_device_time's, on a fake clock): wall-clock shares
    # of these few batches depend on the machine's load, so only their presence is checked.
    assert 0.0 < h.engine.bulk_share < 1.0


async def test_the_engine_sets_the_automatic_bulk_cap_once_measured_and_live_runs() -> None:
    h = Harness(FakeBackend(max_length=64))
    await h.engine.start()
    await h.engine.submit(items(["a b c"] * 2, start=0, lane="bulk"))
    assert await h.engine.drain(timeout_s=10)
    assert h.engine.bulk_batch_cap_ms is None  # not measured, no live batch: full batches
    for k in range(MIN_FIT_BATCHES):  # live batches, one at a time: the fit and a live mean
        await h.engine.submit(items(["a b"], start=100 + k))
        assert await h.engine.drain(timeout_s=10)
    cap = h.engine.bulk_batch_cap_ms
    await h.engine.stop()
    assert cap is not None and cap > 0.0
    assert cap < 1_000.0  # the fake's batches take microseconds: the cap is on their scale

    pinned = Harness(FakeBackend(max_length=64), bulk_max_batch_ms=40.0)
    await pinned.engine.start()
    for k in range(MIN_FIT_BATCHES):
        await pinned.engine.submit(items(["a b"], start=k))
        assert await pinned.engine.drain(timeout_s=10)
    await pinned.engine.stop()
    assert pinned.engine.bulk_batch_cap_ms == 40.0  # a configured cap is never moved


async def test_a_routed_submit_gets_its_own_outcomes() -> None:
    gate = threading.Event()
    backend = FakeBackend(max_length=64, gate=gate)
    h = Harness(backend)
    await h.engine.start()
    mine: list[ItemOutcome] = []
    ids = [h.engine.new_routed_id() for _ in range(3)]
    assert ids == [-1, -2, -3]
    job = [InferenceItem(i, "some bulk text", lane="bulk", group="job") for i in ids]
    await h.engine.submit(job, on_outcomes=mine.extend)
    await _wait_calls(backend, 1)  # held by the gate: still in flight
    with pytest.raises(ValueError, match="already in flight"):
        await h.engine.submit(job[:1], on_outcomes=mine.extend)
    await h.engine.submit(items(["live text"] * 2, start=0))
    gate.set()
    assert await h.engine.drain(timeout_s=10)
    await h.engine.stop()
    assert sorted(o.item_id for o in mine) == sorted(ids)
    assert sorted(h.outcomes) == [0, 1]  # the default callback saw only its own
