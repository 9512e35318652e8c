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
    for name in ("naive", "kbatch", "passthrough", "raw_loop"):
        assert report[name]["drain_statuses"] == {"ok": 60}, (name, report[name])
        assert report[name]["latency_timeouts"] == 0, (name, report[name])
    assert report["setup"]["torch_threads"] == 2
    (plot,) = report["plots"]
    assert Path(plot).stat().st_size > 0
    assert time.monotonic() - started < 180
