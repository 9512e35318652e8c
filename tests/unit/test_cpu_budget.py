"""The CPU budget's decision table on fake cgroup trees, and the thread plan made from it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from consumer.cpu.budget import (
    REPLICA_SHARE,
    QuotaReading,
    cgroup_quota_cores,
    cores_text,
    decide_budget,
    setting_name,
)
from consumer.cpu.plan import PLANNED_ENV, apply_native_env, host_reserve_cores, plan_threads

V1_MOUNTS = (
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 {root} /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
)
V2_MOUNTS = "29 23 0:26 {root} /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def v1_tree(
    root: Path, cgroup: str, quotas: dict[str, tuple[int, int]], mount_root: str = "/"
) -> None:
    """A cgroup v1 host: ``quotas`` maps a directory under the cpu mount to (quota, period)."""
    _write(root, "proc/self/cgroup", f"4:memory:/x\n3:cpu,cpuacct:{cgroup}\n0::/\n")
    _write(root, "proc/self/mountinfo", V1_MOUNTS.format(root=mount_root))
    for directory, (quota, period) in quotas.items():
        base = f"sys/fs/cgroup/cpu,cpuacct/{directory}".rstrip("/")
        _write(root, f"{base}/cpu.cfs_quota_us", f"{quota}\n")
        _write(root, f"{base}/cpu.cfs_period_us", f"{period}\n")


def v2_tree(root: Path, cgroup: str, cpu_max: dict[str, str], mount_root: str = "/") -> None:
    """A cgroup v2 host: ``cpu_max`` maps a directory under /sys/fs/cgroup to its cpu.max."""
    _write(root, "proc/self/cgroup", f"0::{cgroup}\n")
    _write(root, "proc/self/mountinfo", V2_MOUNTS.format(root=mount_root))
    for directory, line in cpu_max.items():
        _write(root, f"sys/fs/cgroup/{directory}/cpu.max".replace("//", "/"), line + "\n")


# ---- reading the quota ----------------------------------------------------------------------


def test_no_cgroup_files_means_no_quota(tmp_path: Path) -> None:
    assert cgroup_quota_cores(tmp_path) is None


def test_v2_cpu_max_max_means_no_quota(tmp_path: Path) -> None:
    v2_tree(tmp_path, "/kubepods/pod1/c1", {"kubepods/pod1/c1": "max 100000"})
    assert cgroup_quota_cores(tmp_path) is None


def test_v2_quota_of_the_process_cgroup(tmp_path: Path) -> None:
    v2_tree(tmp_path, "/kubepods/pod1/c1", {"kubepods/pod1/c1": "150000 100000"})
    reading = cgroup_quota_cores(tmp_path)
    assert reading is not None and reading.cores == 1.5
    assert reading.path.endswith("kubepods/pod1/c1/cpu.max")


def test_v2_the_tightest_ancestor_wins(tmp_path: Path) -> None:
    """A pod-level limit sits on an ancestor of the container's cgroup."""
    v2_tree(
        tmp_path,
        "/kubepods/pod1/c1",
        {"kubepods/pod1/c1": "max 100000", "kubepods/pod1": "200000 100000", "kubepods": "max"},
    )
    reading = cgroup_quota_cores(tmp_path)
    assert reading is not None and reading.cores == 2.0


def test_v2_inside_a_container_namespace(tmp_path: Path) -> None:
    """With a cgroup namespace the process sees itself at ``/`` and the mount shows its own
    cgroup as the root of /sys/fs/cgroup."""
    v2_tree(tmp_path, "/", {"": "50000 100000"})
    reading = cgroup_quota_cores(tmp_path)
    assert reading is not None and reading.cores == 0.5


def test_v1_quota_and_period(tmp_path: Path) -> None:
    v1_tree(tmp_path, "/docker/abc", {"docker/abc": (300000, 100000), "docker": (-1, 100000)})
    reading = cgroup_quota_cores(tmp_path)
    assert reading == QuotaReading(
        300000, 100000, str(tmp_path / "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us")
    )


def test_v1_minus_one_means_no_quota(tmp_path: Path) -> None:
    v1_tree(tmp_path, "/", {"": (-1, 100000)})
    assert cgroup_quota_cores(tmp_path) is None


def test_v1_mount_root_is_stripped_from_the_cgroup_path(tmp_path: Path) -> None:
    """Docker without a cgroup namespace: /proc/self/cgroup says /docker/abc, and the mount
    shows /docker/abc as its root at /sys/fs/cgroup/cpu,cpuacct."""
    v1_tree(tmp_path, "/docker/abc", {"": (100000, 100000)}, mount_root="/docker/abc")
    reading = cgroup_quota_cores(tmp_path)
    assert reading is not None and reading.cores == 1.0


def test_unreadable_numbers_are_no_quota(tmp_path: Path) -> None:
    v2_tree(tmp_path, "/a", {"a": "lots 100000"})
    assert cgroup_quota_cores(tmp_path) is None


# ---- the decision ---------------------------------------------------------------------------


def _quota(cores: float) -> QuotaReading:
    return QuotaReading(int(cores * 100000), 100000, "cpu.max")


@pytest.mark.parametrize(
    ("affinity", "quota", "setting", "cores", "source"),
    [
        (2, None, None, 2, "affinity"),  # no cgroup: the affinity set
        (64, 2.0, None, 2, "cgroup"),  # a 2-CPU limit on a 64-core node
        (64, 1.5, None, 2, "cgroup"),  # rounded up
        (64, 0.5, None, 1, "cgroup"),  # at least one core
        (4, 8.0, None, 4, "affinity"),  # affinity smaller than the quota
        (2, 2.0, None, 2, "affinity"),  # a tie goes to the affinity set
        (64, 4.0, 3.0, 3, "setting"),  # --cpu-budget below both
        (64, 4.0, 8.0, 4, "cgroup"),  # --cpu-budget cannot raise the quota
        (16, None, 2.5, 2.5, "setting"),  # a replica's fractional share
    ],
)
def test_the_budget_is_the_smallest_of_affinity_quota_and_setting(
    affinity: int, quota: float | None, setting: float | None, cores: float, source: str
) -> None:
    budget = decide_budget(affinity, None if quota is None else _quota(quota), setting)
    assert (budget.cores, budget.source) == (cores, source)
    assert budget.describe().startswith(f"{cores:g} core")
    assert "set by" in budget.describe()


def test_a_budget_needs_positive_inputs() -> None:
    with pytest.raises(ValueError, match="--cpu-budget 0"):
        decide_budget(2, None, 0.0)
    with pytest.raises(ValueError, match="affinity_cores=0"):
        decide_budget(0, None, None)


# ---- the thread plan ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cores", "accelerator", "torch", "tokenizer", "reserve"),
    [
        (1, False, 1, 1, 0),  # one core: nothing to keep, torch shares it
        (2, False, 2, 2, 0),  # measured: keeping a core of two cost drain (BENCHMARKS.md)
        (3, False, 2, 1, 1),
        (4, False, 3, 1, 1),
        (16, False, 14, 2, 2),
        (64, False, 60, 4, 4),
        (1, True, 1, 1, 0),
        (2, True, 1, 1, 1),
        (16, True, 1, 8, 1),  # the tokenizer's pool is capped
        (64, True, 1, 8, 1),
    ],
)
def test_plan_keeps_cores_for_the_host_path(
    cores: int, accelerator: bool, torch: int, tokenizer: int, reserve: int
) -> None:
    plan = plan_threads(decide_budget(cores, None, None), accelerator=accelerator)
    assert (plan.torch_threads, plan.tokenizer_threads, plan.host_reserve_cores) == (
        torch,
        tokenizer,
        reserve,
    )
    assert plan.torch_interop_threads == 1
    assert plan.pools()["torch"] == torch


def test_plan_under_replicas_plans_each_share() -> None:
    plan = plan_threads(decide_budget(16, None, None), replicas=4)
    assert plan.share_cores == 4
    assert (plan.torch_threads, plan.tokenizer_threads) == (3, 1)


@pytest.mark.parametrize(
    ("affinity", "quota", "setting", "replicas", "torch", "tokenizer"),
    [
        (2, 1.0, None, 1, 2, 2),  # this project's machine in a 1-CPU cgroup: 2 threads burst
        (64, 2.0, None, 1, 4, 4),  # a 2-CPU limit on a 64-core node: 4 threads, not 64
        (64, 16.0, None, 1, 30, 2),  # 2 x 16 cores to span, 2 kept
        (64, None, None, 1, 60, 4),  # no quota: no burst
        (2, 1.0, 0.5, 1, 1, 1),  # one of two replicas under the quota: a share, no burst
        (64, 0.5, None, 1, 1, 1),  # twice half a core is one core
        (64, 0.25, None, 1, 1, 1),  # rounded up to a budget of 1, never spanning more
        (64, 1.5, None, 1, 3, 3),  # budget 2, threads span 3
        (64, 2.0, 1.0, 1, 1, 1),  # --cpu-budget under a larger quota: as given
        (16, None, 4.0, 1, 3, 1),  # --cpu-budget without a quota: no burst
    ],
)
def test_threads_may_span_twice_a_quota_never_more_than_the_affinity_set(
    affinity: int,
    quota: float | None,
    setting: float | None,
    replicas: int,
    torch: int,
    tokenizer: int,
) -> None:
    budget = decide_budget(affinity, None if quota is None else _quota(quota), setting)
    plan = plan_threads(budget, replicas=replicas)
    assert (plan.torch_threads, plan.tokenizer_threads) == (torch, tokenizer)


@pytest.mark.parametrize(
    ("environ", "torch", "tokenizer", "said"),
    [
        ({}, 14, 2, ""),
        ({"OMP_NUM_THREADS": "4"}, 4, 2, "torch 4 (OMP_NUM_THREADS)"),
        ({"OMP_NUM_THREADS": "lots"}, 14, 2, ""),  # not a count: the rule
        ({"RAYON_NUM_THREADS": "6"}, 14, 6, "tokenizer 6 (RAYON_NUM_THREADS)"),
        ({"TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "6"}, 14, 1, "=false)"),
    ],
)
def test_the_operators_environment_overrides_the_rule(
    environ: dict[str, str], torch: int, tokenizer: int, said: str
) -> None:
    plan = plan_threads(decide_budget(16, None, None), environ=environ)
    assert (plan.torch_threads, plan.tokenizer_threads) == (torch, tokenizer)
    assert said in plan.describe()


def test_torch_threads_setting_overrides_only_torch() -> None:
    plan = plan_threads(decide_budget(16, None, None), torch_threads=5)
    assert plan.torch_threads == 5 and plan.torch_threads_set
    assert plan.tokenizer_threads == 2
    assert "(--torch-threads)" in plan.describe()


def test_host_reserve_is_capped() -> None:
    assert [host_reserve_cores(c) for c in (1, 1.9, 2, 2.5, 8, 9, 16, 17, 33, 256)] == [
        0, 0, 0, 1, 1, 2, 2, 3, 4, 4,
    ]  # fmt: skip


def test_native_env_is_set_unless_the_operator_set_it() -> None:
    plan = plan_threads(decide_budget(4, None, None))
    env = {"OMP_NUM_THREADS": "7"}
    applied = apply_native_env(plan, env)
    marker = env.pop(PLANNED_ENV)
    assert env == {
        "OMP_NUM_THREADS": "7",  # the operator's value stays
        "RAYON_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "3",
        "TOKENIZERS_PARALLELISM": "false",  # a one-thread pool: no pool at all
    }
    assert "OMP_NUM_THREADS" not in applied and "OMP_NUM_THREADS" not in marker


def test_a_tokenizer_pool_of_several_threads_keeps_parallelism() -> None:
    env: dict[str, str] = {}
    apply_native_env(plan_threads(decide_budget(16, None, None)), env)
    assert env["RAYON_NUM_THREADS"] == "2" and "TOKENIZERS_PARALLELISM" not in env


RAYON_PROBE = """
import os, sys
from tokenizers import Tokenizer  # loaded first, as kbatch's tokenizer module does
from consumer.cpu.budget import decide_budget
from consumer.cpu.plan import apply_native_env, plan_threads
tokenizer = Tokenizer.from_file(sys.argv[1])
apply_native_env(plan_threads(decide_budget(int(sys.argv[2]), None, None)))
before = len(os.listdir("/proc/self/task"))
tokenizer.encode_batch(["a few words to split into pieces"] * 4000)
print(len(os.listdir("/proc/self/task")) - before)
"""


@pytest.mark.parametrize(("cores", "pool_threads"), [(1, 0), (16, 2)])
def test_the_tokenizer_pool_follows_the_plan_when_set_after_import(
    tiny_embed_dir: Path, cores: int, pool_threads: int
) -> None:
    """Rayon builds its pool at the first ``encode_batch``, after kbatch set the environment:
    a plan of one tokenizer thread starts no pool, a plan of two starts two threads (not one
    per logical CPU)."""
    import os
    import subprocess
    import sys

    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RAYON_NUM_THREADS", "TOKENIZERS_PARALLELISM")
    }
    out = subprocess.run(
        [sys.executable, "-c", RAYON_PROBE, str(tiny_embed_dir / "tokenizer.json"), str(cores)],
        capture_output=True, text=True, check=True, env=env,
    )  # fmt: skip
    assert int(out.stdout.strip()) == pool_threads


def test_kbatchs_own_variables_are_not_read_back_as_the_operators() -> None:
    """A second model load in one process, or a child process that inherits the environment
    (a test suite starting serve), plans afresh: what kbatch set is not the operator's."""
    env: dict[str, str] = {"OMP_NUM_THREADS": "7"}  # the operator's
    first = plan_threads(decide_budget(4, None, None), environ=env)
    apply_native_env(first, env)
    assert env["TOKENIZERS_PARALLELISM"] == "false" and env["RAYON_NUM_THREADS"] == "1"
    assert first.torch_threads == 7
    child = dict(env)  # inherited
    second = plan_threads(decide_budget(16, None, None), environ=child)
    assert (second.torch_threads, second.torch_from) == (7, "OMP_NUM_THREADS")
    assert (second.tokenizer_threads, second.tokenizer_from) == (2, "plan")
    apply_native_env(second, child)
    assert child["RAYON_NUM_THREADS"] == "2"
    assert "TOKENIZERS_PARALLELISM" not in child  # kbatch's earlier "false" is gone
    assert child["OMP_NUM_THREADS"] == "7"  # the operator's stays
    child["RAYON_NUM_THREADS"] = "5"  # the operator changes it afterwards
    assert plan_threads(decide_budget(16, None, None), environ=child).tokenizer_threads == 5


@pytest.mark.parametrize(
    ("cores", "words"),
    [(1.0, "1 core"), (0.5, "0.5 cores"), (2.0, "2 cores"), (1.5, "1.5 cores")],
)
def test_a_count_of_cores_reads_as_english(cores: float, words: str) -> None:
    """Regression: the start-up line read "a share of 1 of 1 cores" and "1 core(s) each"."""
    assert cores_text(cores) == words


def test_the_start_up_line_names_where_the_setting_came_from() -> None:
    budget = decide_budget(2, None, 1.0, "KBATCH_CPU_BUDGET")
    said = "1 core, set by KBATCH_CPU_BUDGET (affinity 2; 1 from KBATCH_CPU_BUDGET)"
    assert budget.describe() == said
    share = decide_budget(2, None, 1.0, REPLICA_SHARE).describe()
    assert share == "1 core, set by the --replicas split (affinity 2; 1 from the --replicas split)"
    tie = decide_budget(2, None, 2.0).describe()  # a tie goes to the affinity set, the flag shown
    assert tie == "2 cores, set by the affinity set (affinity 2; 2 from --cpu-budget)"
    assert "a share of 1 of 1 core " in plan_threads(budget).describe()
    assert "set by --cpu-budget" in decide_budget(2, None, 1.0).describe()


@pytest.mark.parametrize(
    ("environ", "replica", "name"),
    [
        ({}, False, "--cpu-budget"),  # the flag or a --config file
        ({"KBATCH_CPU_BUDGET": "1"}, False, "KBATCH_CPU_BUDGET"),
        ({"KBATCH_CPU_BUDGET": "3"}, False, "--cpu-budget"),  # the flag wins over the variable
        ({"KBATCH_CPU_BUDGET": "a"}, False, "--cpu-budget"),
        ({"KBATCH_CPU_BUDGET": "1"}, True, "the --replicas split"),
    ],
)
def test_the_start_up_line_names_the_budgets_setting(
    environ: dict[str, str], replica: bool, name: str
) -> None:
    """Regression: the start-up line said "set by --cpu-budget" for a budget from
    ``KBATCH_CPU_BUDGET`` or from the supervisor's share under ``--replicas``."""
    assert setting_name(1.0, environ, replica=replica) == name


@pytest.mark.parametrize(
    ("budget_cores", "torch_threads", "warned"),
    [
        (0.5, None, False),  # one thread is torch's least: nothing to warn of
        (1.0, None, False),
        (1.0, 3, True),  # --torch-threads 3 on one core
    ],
)
def test_torch_is_warned_of_only_above_its_one_thread_minimum(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    budget_cores: float,
    torch_threads: int | None,
    warned: bool,
) -> None:
    """Regression: ``--cpu-budget 0.5`` warned that "torch's 1 threads exceed the 0.5
    cores" and "will take turns", of the one thread serve cannot go below."""
    from consumer.model import loader, torch_backend
    from consumer.model.settings import ModelSettings

    monkeypatch.setattr(torch_backend, "configure_threads", lambda intra, interop=1: intra)
    monkeypatch.setattr("consumer.cpu.plan.apply_native_env", lambda plan, env=None: {})
    settings = ModelSettings.model_construct(
        model="some/dir", cpu_budget=budget_cores, torch_threads=torch_threads
    )
    caplog.set_level(logging.INFO, logger=loader.log.name)
    plan, threads = loader._plan_threads(settings, "cpu")
    assert threads == plan.torch_threads
    said = [r.getMessage() for r in caplog.records if "take turns" in r.getMessage()]
    assert bool(said) is warned, said
    if warned:
        assert said == [
            "torch's 3 threads (--torch-threads) exceed the 1 core the CPU budget lets them "
            "span: they will take turns (docs/CPU.md)"
        ]
