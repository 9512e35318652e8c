"""The CPU budget: how many cores this process may keep busy.

A container's CPU limit is not visible to ``os.cpu_count()`` or to the affinity set: a pod
limited to 2 CPUs on a 64-core node sees 64 cores, and a thread pool sized from them is
throttled by the CFS quota (peers measured it: text-embeddings-inference under a 2-CPU Docker
quota answered 1.82 req/s against 11.03 with its math threads capped, 6.3×). The budget is the
smallest of:

1. the affinity set (``os.sched_getaffinity(0)``: ``taskset``, cpusets, ``--cpuset-cpus``);
2. the cgroup CPU quota, rounded up to whole cores — cgroup v2 ``cpu.max`` (``"max 100000"``
   or ``"<quota_us> <period_us>"``), v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (quota
   ``-1``: none) — the smallest along the process's cgroup and every ancestor up to the
   mount's root (a Kubernetes limit sits on the container's or the pod's cgroup), as Go's
   automaxprocs and the JDK's container support read it;
3. ``--cpu-budget`` / ``KBATCH_CPU_BUDGET`` (cores, may be fractional: a replica's share).

Files are read under ``root`` (``/`` in production, a temporary tree in tests); a file that is
missing or unreadable means "no limit from it", never an error.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = [
    "QUOTA_BURST",
    "REPLICA_SHARE",
    "SETTING_ENV",
    "SETTING_NAME",
    "CpuBudget",
    "QuotaReading",
    "cgroup_quota_cores",
    "cores_text",
    "decide_budget",
    "read_cpu_budget",
    "setting_name",
]

BudgetSource = Literal["affinity", "cgroup", "setting"]
"""What set the budget: the affinity set, the cgroup quota, or ``--cpu-budget``."""

SETTING_NAME = "--cpu-budget"
"""How the start-up line names the setting when nothing more precise is known (the flag, the
``KBATCH_CPU_BUDGET`` variable and a ``--config`` file all set it)."""

SETTING_ENV = "KBATCH_CPU_BUDGET"
"""The setting's environment variable (the settings' ``KBATCH_`` prefix)."""

REPLICA_SHARE = "the --replicas split"
"""How a replica of ``serve --replicas N`` names its budget: the host's, split N ways."""


def setting_name(
    setting_cores: float | None, environ: Mapping[str, str], *, replica: bool = False
) -> str:
    """Where ``setting_cores`` came from, for :meth:`CpuBudget.describe`: :data:`REPLICA_SHARE`
    in a replica (its supervisor passes its share); :data:`SETTING_ENV` when that variable
    holds the value (the flag wins over it, so a different value came from the flag); else
    :data:`SETTING_NAME` (the flag or a ``--config`` file)."""
    if replica:
        return REPLICA_SHARE
    try:
        from_env = float(environ.get(SETTING_ENV, "")) == setting_cores
    except ValueError:
        from_env = False
    return SETTING_ENV if from_env else SETTING_NAME


def cores_text(cores: float) -> str:
    """``"1 core"``, ``"0.5 cores"``, ``"2 cores"``: a count of cores in a log line."""
    return f"{cores:g} core" + ("" if cores == 1 else "s")


@dataclass(frozen=True)
class QuotaReading:
    """One cgroup CPU limit: ``quota_us`` of CPU time per ``period_us`` of wall time.

    ``cores`` = quota / period (e.g. 150000 / 100000 = 1.5 cores); ``path`` is the file it came
    from (for the start-up line)."""

    quota_us: int
    period_us: int
    path: str

    @property
    def cores(self) -> float:
        return self.quota_us / self.period_us


QUOTA_BURST = 2
"""How many times its CFS quota a process's threads may span, in cores (capped by the affinity
set): a quota is a time average (``quota_us`` per 100 ms period), so a pool wider than the
quota finishes a batch sooner and is throttled only when the period's quota runs out.

Measured on this project's 2-core machine with ``kbatch serve`` in a 1-CPU cgroup (MiniLM fp32,
BENCHMARKS.md "CPU budget"): two torch threads answered 65.8 requests/s at p99 137 and 150 ms
and 100.7/s at 499 and 616 ms; one thread 951 and 4,012 ms, then 4,409 and 4,870 ms; eight
threads (an 8-core node's old default) 2,849 and 3,754 ms at 100.7/s. Unbounded it is the
failure peers report (40 torch threads under a 4-CPU limit; text-embeddings-inference 6.3×
slower under a 2-CPU quota with its threads uncapped): each period's quota is spent in a
fraction of it, then every thread waits out the rest."""


@dataclass(frozen=True)
class CpuBudget:
    """The cores this process may use and why.

    Attributes:
        cores: the budget in cores (> 0; fractional only when ``--cpu-budget`` says so).
        affinity_cores: CPUs in the affinity set.
        quota: the tightest cgroup quota found, or None (no quota).
        setting_cores: ``--cpu-budget`` when given.
        source: which of the three set ``cores``.
        setting_name: where ``setting_cores`` came from, for the start-up line
            (``KBATCH_CPU_BUDGET``, a replica's share of ``serve --replicas``).
    """

    cores: float
    affinity_cores: int
    quota: QuotaReading | None
    setting_cores: float | None
    source: BudgetSource
    setting_name: str = SETTING_NAME

    @property
    def thread_cores(self) -> float:
        """How many cores the thread pools may span: ``cores``; when the cgroup quota set the
        budget, ``floor(QUOTA_BURST × quota)`` if that is more (capped by the affinity set):
        a 1-CPU quota spans 2 cores, 1.5 spans 3, 0.5 stays at 1. ``--cpu-budget`` (also a
        replica's share) is taken as given: no burst."""
        if self.source != "cgroup" or self.quota is None:
            return self.cores
        burst = math.floor(QUOTA_BURST * self.quota.cores)
        return min(float(self.affinity_cores), max(self.cores, float(burst)))

    def describe(self) -> str:
        """One line for the start-up log, e.g. ``1 core, set by the cgroup quota (affinity 2;
        cgroup quota 1.00 in /sys/fs/cgroup/cpu/x/cpu.cfs_quota_us)`` or ``0.5 cores, set by
        KBATCH_CPU_BUDGET (affinity 2; 0.5 from KBATCH_CPU_BUDGET)``."""
        parts = [f"affinity {self.affinity_cores}"]
        if self.quota is not None:
            parts.append(f"cgroup quota {self.quota.cores:.2f} in {self.quota.path}")
        if self.setting_cores is not None:
            parts.append(f"{self.setting_cores:g} from {self.setting_name}")
        by = _SOURCE_WORDS.get(self.source, self.setting_name)
        return f"{cores_text(self.cores)}, set by {by} ({'; '.join(parts)})"


_SOURCE_WORDS: dict[BudgetSource, str] = {
    "affinity": "the affinity set",
    "cgroup": "the cgroup quota",
}


def decide_budget(
    affinity_cores: int,
    quota: QuotaReading | None,
    setting_cores: float | None,
    setting_name: str = SETTING_NAME,
) -> CpuBudget:
    """The budget from its three inputs (pure; the decision table of the module docstring).

    The quota is rounded up to whole cores (1.5 → 2: a pool of 2 threads under a 1.5-core
    quota still finishes its work, 1 thread would leave half a core unused); ties go to the
    affinity set, then the quota.

    Raises:
        ValueError: ``affinity_cores`` < 1 or ``setting_cores`` ≤ 0.
    """
    if affinity_cores < 1:
        raise ValueError(f"affinity_cores={affinity_cores}: at least 1")
    if setting_cores is not None and setting_cores <= 0:
        raise ValueError(f"--cpu-budget {setting_cores:g}: must be > 0")
    cores: float = affinity_cores
    source: BudgetSource = "affinity"
    if quota is not None and math.ceil(quota.cores) < cores:
        cores, source = math.ceil(quota.cores), "cgroup"
    if setting_cores is not None and setting_cores < cores:
        cores, source = setting_cores, "setting"
    return CpuBudget(cores, affinity_cores, quota, setting_cores, source, setting_name)


def read_cpu_budget(
    setting_cores: float | None = None,
    *,
    setting_name: str = SETTING_NAME,
    root: Path = Path("/"),
) -> CpuBudget:
    """The budget of this process (reads the affinity set and the cgroup files under ``root``);
    ``setting_name`` names where ``setting_cores`` came from in :meth:`CpuBudget.describe`.

    Raises:
        ValueError: ``setting_cores`` ≤ 0.
    """
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        affinity = os.cpu_count() or 1
    return decide_budget(max(1, affinity), cgroup_quota_cores(root), setting_cores, setting_name)


# ---- the cgroup files -----------------------------------------------------------------------


def cgroup_quota_cores(root: Path = Path("/")) -> QuotaReading | None:
    """The tightest CPU quota over this process's cgroups (v2 and v1), None when there is none.

    Reads ``proc/self/cgroup`` (which cgroup, per hierarchy) and ``proc/self/mountinfo`` (where
    each hierarchy is mounted, and which of its paths the mount shows: inside a container the
    mount's root is the container's own cgroup) under ``root``.
    """
    memberships = _read_lines(root / "proc/self/cgroup")
    mounts = _read_lines(root / "proc/self/mountinfo")
    readings: list[QuotaReading] = []
    for line in memberships:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if not path:
            continue
        if hierarchy == "0" and controllers == "":
            mount = _find_mount(mounts, lambda fs, _opts: fs == "cgroup2")
            if mount is not None:
                readings += _walk_up(root, mount, path, _read_cpu_max)
        elif "cpu" in controllers.split(","):
            mount = _find_mount(
                mounts, lambda fs, opts: fs == "cgroup" and "cpu" in opts.split(",")
            )
            if mount is not None:
                readings += _walk_up(root, mount, path, _read_cfs)
    return min(readings, key=lambda r: r.cores, default=None)


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except OSError:
        return []


def _find_mount(mounts: list[str], wanted: Callable[[str, str], bool]) -> tuple[str, str] | None:
    """(the mount's root within the hierarchy, its mount point) of the first mount whose file
    system type and super options ``wanted(fs_type, super_options)`` accepts."""
    for line in mounts:
        fields, sep, tail = line.partition(" - ")
        if not sep:
            continue
        left = fields.split()
        right = tail.split()
        if len(left) < 5 or len(right) < 3:
            continue
        if wanted(right[0], right[2]):
            return _unescape(left[3]), _unescape(left[4])
    return None


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (``\\040``)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def _walk_up(
    root: Path,
    mount: tuple[str, str],
    cgroup_path: str,
    read: Callable[[Path], QuotaReading | None],
) -> list[QuotaReading]:
    """Every quota from the process's cgroup directory up to the mount point."""
    mount_root, mount_point = mount
    rel = cgroup_path
    if mount_root != "/" and (rel == mount_root or rel.startswith(mount_root.rstrip("/") + "/")):
        rel = rel[len(mount_root) :]
    base = root / mount_point.lstrip("/")
    directory = base / rel.strip("/") if rel.strip("/") else base
    found: list[QuotaReading] = []
    while True:
        reading = read(directory)
        if reading is not None:
            found.append(reading)
        if directory == base or base not in directory.parents:
            return found
        directory = directory.parent


def _read_cpu_max(directory: Path) -> QuotaReading | None:
    """cgroup v2 ``cpu.max``: ``"<quota_us|max> <period_us>"``."""
    path = directory / "cpu.max"
    try:
        quota, _, period = path.read_text().strip().partition(" ")
    except OSError:
        return None
    if quota == "max":
        return None
    return _reading(quota, period or "100000", path)


def _read_cfs(directory: Path) -> QuotaReading | None:
    """cgroup v1 ``cpu.cfs_quota_us`` (``-1``: none) and ``cpu.cfs_period_us``."""
    try:
        quota = (directory / "cpu.cfs_quota_us").read_text().strip()
        period = (directory / "cpu.cfs_period_us").read_text().strip()
    except OSError:
        return None
    return _reading(quota, period, directory / "cpu.cfs_quota_us")


def _reading(quota: str, period: str, path: Path) -> QuotaReading | None:
    try:
        quota_us, period_us = int(quota), int(period)
    except ValueError:
        return None
    if quota_us <= 0 or period_us <= 0:
        return None
    return QuotaReading(quota_us, period_us, str(path))
