"""``kbatch bench e2e`` end to end on the tiny embedder: every variant runs and reports.

Figures only have to exist and be positive: speed belongs to the benchmark, not to a test.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from consumer.bench.e2e_report import RATIOS, VARIANTS
from tests.integration.harness import KBATCH

pytestmark = pytest.mark.integration


def test_bench_e2e_json_has_every_variant_and_ratio(
    kafka_bootstrap: str, tiny_embed_dir: Path, tmp_path: Path
) -> None:
    started = time.monotonic()
    args = [
        KBATCH, "bench", "e2e",
        "--model", str(tiny_embed_dir),
        "--n", "60",
        "--latency-s", "1",
        "--latency-warmup-s", "0.5",
        "--bootstrap", kafka_bootstrap,
        "--plots-dir", str(tmp_path / "plots"),
        "--log-dir", str(tmp_path / "logs"),
        "--json",
    ]  # fmt: skip
    proc = subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    for name in VARIANTS:
        row = report[name]
        for key in ("seq_per_s", "p50_ms", "p99_ms"):
            assert isinstance(row[key], int | float) and row[key] > 0, (name, key, row)
    for key, _, _ in RATIOS:
        assert isinstance(report[key], float) and report[key] > 0, (key, report[key])
    for name in (
        "naive",
        "kbatch",
        "kbatch_eos",
        "passthrough",
        "raw_loop",
        "raw_tokenize",
        "raw_tokenize_confluent",
    ):
        assert report[name]["drain_statuses"] == {"ok": 60}, (name, report[name])
        assert report[name]["latency_timeouts"] == 0, (name, report[name])
    assert report["setup"]["torch_threads"] == "auto"  # each process its own plan
    (plot,) = report["plots"]
    assert Path(plot).stat().st_size > 0
    assert time.monotonic() - started < 180


def test_bench_e2e_simulated_device_with_replicas_reports_device_and_cpu_figures(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    args = [
        KBATCH, "bench", "e2e",
        "--model", "sim:1,0.445",
        "--variants", "kbatch,passthrough",
        "--replicas", "1,2",
        "--n", "200",
        "--latency-s", "0.5",
        "--latency-warmup-s", "0.2",
        "--latency-fractions", "0.3",
        "--latency-rates", "20",
        "--target-p99-ms", "500",
        "--bootstrap", kafka_bootstrap,
        "--log-dir", str(tmp_path / "logs"),
        "--plots-dir", str(tmp_path / "plots"),
        "--json",
    ]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, timeout=400, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["setup"]["model"] == "sim:1,0.445"
    assert report["setup"]["partitions"] == 2
    for key, replicas in (
        ("kbatch", 1),
        ("kbatch_x2", 2),
        ("passthrough", 1),
        ("passthrough_x2", 2),
    ):
        row = report[key]
        assert row["replicas"] == replicas
        assert row["drain_statuses"] == {"ok": 200}, (key, row)
        assert row["cpu_us_per_record"] > 0, (key, row)
    for key in ("kbatch", "kbatch_x2"):  # the simulated device: busy some of the time
        row = report[key]
        assert 0 < row["device_busy_fraction"] <= 1, row
        assert row["cores_per_device"] == pytest.approx(
            row["device_seq_per_s"] * row["cpu_us_per_record"] / 1e6, rel=0.01
        )
    assert report["passthrough"]["device_busy_fraction"] is None  # noop: no device
    assert report["ratio_kbatch_x2_vs_x1"] > 0 and report["ratio_passthrough_x2_vs_x1"] > 0
    # The frontier: one point per fraction and per absolute rate, each with its stages.
    assert report["setup"]["target_p99_ms"] == 500.0
    points = report["kbatch"]["frontier"]
    assert [p["point"] for p in points] == ["0.3x", "20/s"]
    assert points[1]["rate_per_s"] == 20.0
    for p in points:
        assert p["p50_ms"] > 0 and p["p99_ms"] >= p["p50_ms"] and p["timeouts"] == 0, p
        assert p["stages_ms"]["forward"]["p50"] > 0, p
    stages = report["kbatch"]["stages_ms"]
    assert set(stages) == {"send_lag", "intake", "queue", "forward", "reply"}
    assert all(stages[s]["p50"] is not None for s in stages), stages
    assert stages["forward"]["p50"] >= 1.0  # the simulated device's fixed 1 ms
    plots = [Path(p).name for p in report["plots"]]
    assert plots == ["bench_e2e.png", "bench_e2e_frontier.png"]


def test_bench_e2e_raw_tokenize_confluent_answers_and_reports_cpu_ratios(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The confluent-kafka loop answers every request (drain and open-loop points), and the
    report compares kbatch's CPU per request with both raw loops at each absolute rate."""
    args = [
        KBATCH, "bench", "e2e",
        "--model", "sim:1,0.445",
        "--variants", "kbatch,raw_tokenize,raw_tokenize_confluent",
        "--n", "300",
        "--latency-s", "1",
        "--latency-warmup-s", "0.2",
        "--latency-rates", "50",
        "--bootstrap", kafka_bootstrap,
        "--log-dir", str(tmp_path / "logs"),
        "--json",
    ]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    row = report["raw_tokenize_confluent"]
    assert row["drain_statuses"] == {"ok": 300}, row
    assert row["latency_ok"] > 0 and row["latency_timeouts"] == 0, row
    assert row["seq_per_s"] > 0 and row["cpu_us_per_record"] > 0, row
    (point,) = row["frontier"]
    assert point["point"] == "50/s" and point["timeouts"] == 0, point
    assert point["cpu_ms_per_request"] > 0, point
    for key in (
        "cpu_ratio_kbatch_vs_raw_tokenize",
        "cpu_ratio_kbatch_vs_raw_tokenize_confluent",
        "cpu_ratio_raw_tokenize_vs_raw_tokenize_confluent",
    ):
        (ratio,) = report[key].values()
        assert list(report[key]) == ["50/s"] and ratio > 0, (key, report[key])
