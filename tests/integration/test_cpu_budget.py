"""``kbatch serve`` in a 1-CPU cgroup on this machine reads its budget from the quota, not from
the cores it can see, and sizes its thread pools from it (docs/CPU.md)."""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from consumer.cpu.plan import PLANNED_ENV
from tests.conftest import TopicFactory, unique_group
from tests.integration.harness import ServeProcess

ROOT = Path(__file__).resolve().parents[2]
CGROUP_RUN = str(ROOT / "scripts" / "cgroup_run.sh")
NO_CGROUP = 77
"""scripts/cgroup_run.sh's exit status when no CPU cgroup can be written here."""

pytestmark = pytest.mark.integration

THREAD_ENV = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "RAYON_NUM_THREADS",
    "TOKENIZERS_PARALLELISM",
    PLANNED_ENV,
)


def _cgroup_dirs(name: str) -> list[Path]:
    return [Path("/sys/fs/cgroup/cpu") / name, Path("/sys/fs/cgroup") / name]


@pytest.fixture
def one_cpu_group() -> Iterator[str]:
    """A fresh cgroup name whose quota is one CPU (removed afterwards); skips where cgroups
    cannot be written (not root, no cpu controller)."""
    name = f"kbatch-test-{uuid.uuid4().hex[:8]}"
    probe = subprocess.run(
        [CGROUP_RUN, name, "1", "--", "true"], capture_output=True, text=True, check=False
    )
    if probe.returncode == NO_CGROUP:
        pytest.skip(f"no writable CPU cgroup here: {probe.stderr.strip()}")
    assert probe.returncode == 0, probe.stderr
    yield name
    for directory in _cgroup_dirs(name):
        with contextlib.suppress(OSError):
            directory.rmdir()


async def _serve(
    tmp_path: Path, bootstrap: str, new_topic: TopicFactory, model: str, **kw: Any
) -> tuple[dict[str, float], str]:
    """Start ``kbatch serve`` with no ``--torch-threads`` (the plan decides), wait until ready,
    stop it; its metrics while it ran and its log."""
    req, rep, dlq = await new_topic("req"), await new_topic("rep"), await new_topic("dlq")
    server = ServeProcess.start(
        tmp_path,
        bootstrap=bootstrap,
        request_topic=req,
        reply_topic=rep,
        dlq_topic=dlq,
        group_id=unique_group("cpu"),
        model=model,
        torch_threads=None,
        # what the test process's environment says is not this test's subject (unit tests
        # cover the overrides): the full suite's process carries TOKENIZERS_PARALLELISM=false
        env_drop=THREAD_ENV,
        **kw,
    )
    try:
        server.wait_ready()
        metrics = server.metrics()
    finally:
        server.stop()
    assert server.wait() == 0, server.log_tail()
    return metrics, server.log_path.read_text()


async def test_serve_in_a_one_cpu_cgroup_reads_its_budget_from_the_quota(
    tmp_path: Path,
    kafka_bootstrap: str,
    new_topic: TopicFactory,
    tiny_embed_dir: Path,
    one_cpu_group: str,
) -> None:
    metrics, log = await _serve(
        tmp_path,
        kafka_bootstrap,
        new_topic,
        str(tiny_embed_dir),
        prefix=[CGROUP_RUN, one_cpu_group, "1", "--"],
    )
    assert metrics["kbatch_cpu_budget_cores"] == 1  # the quota, not the machine's cores
    assert metrics['kbatch_threads{pool="torch"}'] == 2  # may span 2 x the quota (QUOTA_BURST)
    assert metrics['kbatch_threads{pool="tokenizer"}'] == 2  # nothing kept: takes turns
    assert "CPU budget 1 core, set by the cgroup quota" in log, log[-2000:]
    assert "threads may span 2 cores under the quota" in log


async def test_cpu_budget_setting_caps_the_plan(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    """``--cpu-budget`` (``KBATCH_CPU_BUDGET``): half a core still runs one torch thread, and
    the metric shows the budget as given."""
    metrics, _log = await _serve(
        tmp_path, kafka_bootstrap, new_topic, "noop", extra=["--cpu-budget", "0.5"]
    )
    assert metrics["kbatch_cpu_budget_cores"] == 0.5
    assert metrics['kbatch_threads{pool="torch"}'] == 1
