"""Thread names and CPU by role (consumer/cpu/threads.py, kbatch_thread_cpu_seconds_total)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from consumer.cpu.threads import ThreadCpu, name_os_thread, role_of
from consumer.serve.metrics import Metrics

PID = 4242


def _task(root: Path, tid: int, comm: str, utime: int, stime: int) -> None:
    """One /proc/<pid>/task/<tid>/stat line, as the kernel writes it."""
    d = root / str(tid)
    d.mkdir(exist_ok=True)
    rest = ["S", "1"] + ["0"] * 9 + [str(utime), str(stime)] + ["0"] * 30
    (d / "stat").write_text(f"{tid} ({comm}) {' '.join(rest)}\n")


def test_roles_come_from_the_os_thread_names() -> None:
    assert role_of("kbatch", main=True) == "event_loop"
    assert role_of("kbatch-model", main=False) == "model"
    assert role_of("kbatch-tokenize", main=False) == "tokenizer"
    assert role_of("kbatch-source", main=False) == "kafka_consumer"
    assert role_of("rdk:broker1", main=False) == "librdkafka"
    assert role_of("rdk:main", main=False) == "librdkafka"
    assert role_of("kbatch-job grou", main=False) == "jobs"
    assert role_of("kbatch", main=False) == "other"  # torch's pools, a blocking call's thread


def test_samples_are_the_seconds_each_role_spent_since_the_last(tmp_path: Path) -> None:
    _task(tmp_path, PID, "kbatch", 100, 50)  # spent before the first sample: not counted
    _task(tmp_path, PID + 1, "kbatch-model", 10, 0)
    cpu = ThreadCpu(tmp_path, pid=PID, ticks_per_s=100)
    assert cpu.sample() == {}
    _task(tmp_path, PID, "kbatch", 130, 60)  # +40 ticks
    _task(tmp_path, PID + 1, "kbatch-model", 15, 5)  # +10
    _task(tmp_path, PID + 2, "rdk:broker1", 7, 3)  # born since: all of its 10
    _task(tmp_path, PID + 3, "rdk:main", 2, 0)
    assert cpu.sample() == pytest.approx({"event_loop": 0.4, "model": 0.1, "librdkafka": 0.12})


def test_a_thread_that_ended_keeps_what_it_spent_and_names_may_hold_parentheses(
    tmp_path: Path,
) -> None:
    _task(tmp_path, PID, "kbatch", 0, 0)
    _task(tmp_path, PID + 1, "a (b) c", 0, 0)
    cpu = ThreadCpu(tmp_path, pid=PID, ticks_per_s=100)
    _task(tmp_path, PID + 1, "a (b) c", 20, 0)
    assert cpu.sample() == pytest.approx({"other": 0.2})
    for f in (tmp_path / str(PID + 1)).iterdir():
        f.unlink()
    (tmp_path / str(PID + 1)).rmdir()
    _task(tmp_path, PID + 5, "a (b) c", 1, 0)  # a new thread under the same name
    assert cpu.sample() == pytest.approx({"other": 0.01})  # nothing negative, nothing twice


def test_nothing_is_reported_without_proc(tmp_path: Path) -> None:
    cpu = ThreadCpu(tmp_path / "absent", pid=PID, ticks_per_s=100)
    assert not cpu.available
    assert cpu.sample() == {}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl names threads on Linux")
def test_a_named_thread_shows_its_name_in_proc_cut_to_15_bytes() -> None:
    seen: list[str] = []

    def run() -> None:
        name_os_thread("kbatch-tokenize-and-more")
        tid = threading.get_native_id()
        seen.append(Path(f"/proc/self/task/{tid}/comm").read_text().strip())

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == ["kbatch-tokenize"]


def test_the_refresh_counts_each_roles_cpu_into_the_metric() -> None:
    metrics = Metrics()
    spent = [{"event_loop": 1.5, "model": 0.25}, {"event_loop": 0.5}]

    class FakeThreadCpu:
        def sample(self) -> dict[str, float]:
            return spent.pop(0)

    metrics.thread_cpu = FakeThreadCpu()  # type: ignore[assignment]
    metrics.refresh(10.0)
    metrics.refresh(10.5)  # within the second: not sampled
    metrics.refresh(11.0)

    def value(role: str) -> float | None:
        return metrics.registry.get_sample_value(
            "kbatch_thread_cpu_seconds_total", {"thread": role}
        )

    assert value("event_loop") == pytest.approx(2.0)
    assert value("model") == pytest.approx(0.25)
