"""``kbatch_model_busy_ratio``: the fraction of recent wall time the model ran batches."""

from __future__ import annotations

import random
from collections import deque

import pytest

from consumer.serve.metrics import BusyWindow, Metrics, PrometheusStats


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def test_zero_before_any_batch() -> None:
    assert BusyWindow(60, FakeClock()).ratio() == 0.0


def test_half_busy_over_the_window() -> None:
    clock = FakeClock()
    busy = BusyWindow(10, clock)
    for _ in range(20):  # 0.25 s batch, 0.25 s idle, for 10 s
        clock.now_s += 0.25
        busy.add(0.25)
        clock.now_s += 0.25
    assert busy.ratio() == pytest.approx(0.5)


def test_old_batches_leave_the_window_and_a_straddling_one_counts_in_part() -> None:
    clock = FakeClock()
    busy = BusyWindow(10, clock)
    clock.now_s += 4.0
    busy.add(4.0)  # busy over [1000, 1004]
    clock.now_s = 1012.0  # window [1002, 1012]: 2 s of that batch are inside
    assert busy.ratio() == pytest.approx(0.2)
    clock.now_s = 1030.0
    assert busy.ratio() == 0.0


def test_a_young_process_divides_by_its_age_not_the_window() -> None:
    clock = FakeClock()
    busy = BusyWindow(60, clock)
    clock.now_s += 1.0
    busy.add(1.0)
    clock.now_s += 1.0
    assert busy.ratio() == pytest.approx(0.5)  # 1 s busy out of 2 s alive, not 1/60


def test_fully_busy_is_one_and_the_window_must_be_positive() -> None:
    clock = FakeClock()
    busy = BusyWindow(5, clock)
    for _ in range(10):
        clock.now_s += 1.0
        busy.add(1.0)
    assert busy.ratio() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="window_s"):
        BusyWindow(0)


def _brute_force(batches: list[tuple[float, float]], now: float, start: float) -> float:
    busy = sum(max(0.0, min(e, now) - max(b, start)) for b, e in batches)
    return min(1.0, busy / (now - start))


def test_the_ratio_is_the_busy_time_inside_the_window_for_any_mix_of_batches() -> None:
    """Batches of mixed lengths, also overlapping (two devices of a fan-out), scraped at
    random times: the ratio equals the overlap of each batch with the window, summed."""
    rng = random.Random(7)
    clock = FakeClock()
    busy = BusyWindow(3, clock)
    added: list[tuple[float, float]] = []
    first = None
    for _ in range(3000):
        clock.now_s += rng.choice([0.0, 0.0005, 0.002, 0.05])
        length = rng.choice([0.001, 0.01, 0.4, 2.5])
        busy.add(length)
        added.append((clock.now_s - length, clock.now_s))
        first = added[0][0] if first is None else first
        if rng.random() < 0.05:
            clock.now_s += rng.choice([0.0, 0.3, 4.0])
            start = max(clock.now_s - 3, first)
            assert busy.ratio() == pytest.approx(_brute_force(added, clock.now_s, start), abs=1e-9)


class _CountingDeque(deque[tuple[float, float]]):
    visited = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        for entry in super().__iter__():
            _CountingDeque.visited += 1
            yield entry


def test_a_scrape_reads_a_few_batches_not_every_batch_of_the_window() -> None:
    """A scrape holds the lock the model thread's add waits for: with 30,000 batches in the
    window (500 a second for a minute) it must not walk them all (it took ~5 ms)."""
    clock = FakeClock()
    busy = BusyWindow(60, clock)
    busy._batches = _CountingDeque()
    for _ in range(30_000):
        clock.now_s += 0.002
        busy.add(0.001)
    _CountingDeque.visited = 0
    assert busy.ratio() == pytest.approx(0.5, rel=1e-4)
    assert _CountingDeque.visited <= 3


def test_the_gauge_is_exported_and_fed_by_the_engine_stats_sink() -> None:
    metrics = Metrics()
    clock = FakeClock()
    metrics.model_busy = busy = BusyWindow(10, clock)
    metrics.model_busy_ratio.set_function(busy.ratio)
    clock.now_s += 2.0
    PrometheusStats(metrics).on_batch(8, 100, 128, infer_ms=1000.0)
    clock.now_s += 1.0  # 1 s busy out of the 2 s since that batch started
    assert metrics.registry.get_sample_value("kbatch_model_busy_ratio") == pytest.approx(0.5)


def test_gpu_memory_reads_the_models_probe_on_refresh() -> None:
    """kbatch_gpu_memory_bytes was declared and never set (0 on a GPU too): it now reads the
    loaded model's probe once a second of the beat."""
    m = Metrics()
    in_use = [3 * 2**30]
    m.device_memory = lambda: in_use[0]
    m.refresh(1.0)
    assert m.registry.get_sample_value("kbatch_gpu_memory_bytes") == 3 * 2**30
    in_use[0] = 2**30
    m.refresh(1.5)  # within the second: unchanged
    assert m.registry.get_sample_value("kbatch_gpu_memory_bytes") == 3 * 2**30
    m.refresh(2.0)
    assert m.registry.get_sample_value("kbatch_gpu_memory_bytes") == 2**30


def test_a_cpu_model_reports_no_gpu_memory() -> None:
    from consumer.model.loader import LoadedModel

    loaded = object.__new__(LoadedModel)  # only the device is read
    object.__setattr__(loaded, "device", "cpu")
    assert loaded.device_memory_bytes() == 0
    from consumer.model.torch_backend import allocated_bytes

    assert allocated_bytes("cpu") == 0
