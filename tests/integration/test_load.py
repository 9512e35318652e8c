"""``kbatch load`` against the real broker and a real ``kbatch serve`` on the tiny embedder:
the requested rate is kept (±10 %), every request is answered, the reports parse."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from consumer.kafka.admin import create_topics, delete_topics
from producer_tools.load import LoadOptions, run_load
from tests.conftest import unique_group
from tests.integration.harness import KBATCH, ServeProcess

RATE_TOLERANCE = 0.10
"""Achieved send rate within ±10 % of the offered rate (2-core CI box, server on the same)."""


@dataclass(frozen=True)
class Served:
    bootstrap: str
    requests: str
    replies: str
    server: ServeProcess

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.server.metrics_port}/metrics"

    def topic_flags(self) -> list[str]:
        return [
            "--bootstrap", self.bootstrap,
            "--request-topic", self.requests,
            "--reply-topic", self.replies,
        ]  # fmt: skip


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str, tiny_embed_dir: Path
) -> Iterator[Served]:
    suffix = unique_group("l").rsplit(".", 1)[-1]
    requests, replies, dlq = (f"test.load-{n}.{suffix}" for n in ("req", "rep", "dlq"))
    asyncio.run(create_topics(kafka_bootstrap, [requests], partitions=2))
    asyncio.run(create_topics(kafka_bootstrap, [replies, dlq], partitions=1))
    server = ServeProcess.start(
        tmp_path_factory.mktemp("serve"),
        bootstrap=kafka_bootstrap,
        request_topic=requests,
        reply_topic=replies,
        dlq_topic=dlq,
        group_id=unique_group("load"),
        model=str(tiny_embed_dir),
        extra=["--max-wait-ms", "5"],
    )
    try:
        server.wait_ready()
        yield Served(kafka_bootstrap, requests, replies, server)
    finally:
        server.stop()
        asyncio.run(delete_topics(kafka_bootstrap, [requests, replies, dlq]))


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "texts.jsonl"
    lines = [json.dumps({"text": f"sentence {i} " + "word " * (i % 40)}) for i in range(200)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _within(actual: float, expected: float) -> bool:
    return abs(actual - expected) <= RATE_TOLERANCE * expected


def test_constant_load_keeps_the_rate_and_its_json_report_parses(
    served: Served, corpus_file: Path
) -> None:
    out = subprocess.run(
        [KBATCH, "load", "--pattern", "constant", "--rate", "40", "--duration-s", "3",
         "--warmup-s", "0.5", "--corpus", str(corpus_file), "--json", "--no-progress",
         "--metrics-url", served.metrics_url, *served.topic_flags()],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    s = report["summary"]
    assert s["scheduled"] == 120 and s["sent"] == 120
    assert s["offered_rate_per_s"] == 40
    assert _within(s["achieved_send_rate_per_s"], 40), s
    assert s["answered"] == s["ok"] == 120 and s["timeouts"] == 0
    lat = s["latency_ms"]
    assert 0 < lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["max"] < 30_000
    assert s["batch_size_mean"] >= 1 and s["padded_len_mean"] > 0
    assert 0 < s["padding_efficiency"] <= 1
    assert report["setup"]["warmup_s"] == 0.5 and report["phases"] == [s]


def test_step_sweep_reports_each_step_and_writes_the_plots(
    served: Served, corpus_file: Path, tmp_path: Path
) -> None:
    out = subprocess.run(
        [KBATCH, "load", "--pattern", "step", "--rates", "10,30", "--step-s", "2",
         "--warmup-s", "0", "--corpus", str(corpus_file), "--json", "--no-progress",
         "--plots-dir", str(tmp_path), *served.topic_flags(),
         # a shared machine's p99 of a few ms jitters by more than 3x: the throughput rule here
         "--knee-p99-factor", "50"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert "p99 > 50 x the first step's" in report["knee"]["rule"]
    steps = report["phases"]
    assert [p["name"] for p in steps] == ["step 1 @ 10/s", "step 2 @ 30/s"]
    for step, rate in zip(steps, (10, 30), strict=True):
        assert step["scheduled"] == 2 * rate and step["timeouts"] == 0
        assert _within(step["achieved_send_rate_per_s"], rate), step
    assert report["knee"]["knee_step"] == 2  # the tiny model keeps up with both
    names = sorted(Path(p).name for p in report["plots"])
    assert names == [
        "step_latency_cdf.png",
        "step_latency_over_time.png",
        "step_throughput_over_time.png",
        "step_throughput_vs_offered.png",
    ]
    for p in report["plots"]:
        assert Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def test_pulse_run_marks_its_bursts(served: Served, corpus_file: Path) -> None:
    texts = [json.loads(line)["text"] for line in corpus_file.read_text().splitlines()]
    run = await run_load(
        LoadOptions(
            bootstrap=served.bootstrap,
            request_topic=served.requests,
            reply_topic=served.replies,
            texts=texts,
            pattern="pulse",
            rate_per_s=10,
            duration_s=4,
            burst_factor=4,
            burst_s=1,
            burst_every_s=3,
            warmup_s=0,
        ),
        progress=False,
    )
    r = run.report
    assert [p["name"] for p in r["phases"]] == ["base", "burst", "after burst"]
    burst = r["phases"][1]
    assert burst["scheduled"] == 40 and burst["offered_rate_per_s"] == 40
    assert len(r["bursts"]) == 1 and r["bursts"][0]["rate_per_s"] == 40
    assert r["bursts"][0]["p99_during_ms"] is not None
    assert r["summary"]["timeouts"] == 0 and r["summary"]["answered"] == len(run.schedule)


def test_timeouts_fail_the_run_unless_allowed(kafka_bootstrap: str, corpus_file: Path) -> None:
    """Nobody serves these topics: every request times out, so ``kbatch load`` exits 1 by
    default (--max-error-rate 0) and 0 when the caller allows every request to fail."""
    suffix = unique_group("nl").rsplit(".", 1)[-1]
    requests, replies = f"test.load-unserved-req.{suffix}", f"test.load-unserved-rep.{suffix}"
    asyncio.run(create_topics(kafka_bootstrap, [requests, replies]))
    base = [
        KBATCH, "load", "--count", "3", "--rate", "20", "--warmup-s", "0", "--timeout-s", "0.5",
        "--no-probe", "--no-progress", "--json", "--corpus", str(corpus_file),
        "--bootstrap", kafka_bootstrap, "--request-topic", requests, "--reply-topic", replies,
    ]  # fmt: skip
    try:
        failed = subprocess.run(base, capture_output=True, text=True, timeout=60, check=False)
        allowed = subprocess.run(
            [*base, "--max-error-rate", "1"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        asyncio.run(delete_topics(kafka_bootstrap, [requests, replies]))
    assert failed.returncode == 1, failed.stderr
    assert "error rate 100.00% is above --max-error-rate 0.00%" in failed.stderr
    assert json.loads(failed.stdout)["summary"]["timeouts"] == 3
    assert allowed.returncode == 0, allowed.stderr


def test_a_client_install_without_torch_requests_and_loads(
    served: Served, corpus_file: Path
) -> None:
    """``kbatch request`` and ``kbatch load`` where torch, transformers and the rest of the
    [serve] extra cannot be imported (tests/fixtures/no_torch), against a real serve."""
    no_torch = Path(__file__).resolve().parents[1] / "fixtures" / "no_torch"
    path = os.pathsep.join(p for p in (str(no_torch), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    blocked = subprocess.run(
        [sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True
    )
    assert blocked.returncode == 1  # the fixture is in force for these processes
    out = subprocess.run(
        [KBATCH, "request", "no torch here", "--key", "client-1", *served.topic_flags()],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "embedding" in out.stdout or "dim" in out.stdout, out.stdout
    out = subprocess.run(
        [KBATCH, "load", "--count", "20", "--rate", "20", "--warmup-s", "0", "--corpus",
         str(corpus_file), "--json", "--no-progress", *served.topic_flags()],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["summary"]["ok"] == 20
