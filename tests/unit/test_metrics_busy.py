"""``kbatch_model_busy_ratio``: the fraction of recent wall time the model ran batches."""

from __future__ import annotations

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
