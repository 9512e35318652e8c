"""Thread-pool sizes from a CPU budget, with cores kept for the host path.

A ``kbatch serve`` process runs, besides the model's math threads: the event loop (decode,
buckets, replies and the Kafka client, all Python: at most one core), the tokenizer (one worker
thread calling the Rust tokenizer, whose ``encode_batch`` fans out to a Rayon pool) and the
metrics server. Before this plan every pool was sized from every visible core: torch's intra-op
pool from the affinity set, Rayon's from every logical CPU. Measured on the 2-core machine
(BENCHMARKS.md "What limits them"): ~0.45 core of other work beside torch's two
lock-stepped threads cut their drain by a third to a half. Peers keep cores free: vLLM's CPU
backend reserves one core by default, text-embeddings-inference sizes its tokenizer pool to
``cpus - 1`` "to leave some CPU for the backend", Ray sets ``OMP_NUM_THREADS=1`` unless an
actor asks for CPUs.

:func:`plan_threads` is the rule (pure, a decision table in the tests); :func:`apply_native_env`
sets what native pools read when they start (Rayon, OpenMP, MKL); torch itself is configured
from the plan by :func:`consumer.model.torch_backend.configure_threads`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

from consumer.cpu.budget import CpuBudget, cores_text

__all__ = [
    "ThreadPlan",
    "apply_native_env",
    "budget_cores_whole",
    "host_reserve_cores",
    "plan_threads",
]

GPU_TOKENIZER_MAX_THREADS = 8
"""Most Rayon threads for the tokenizer on an accelerator host: a poll chunk of 500 short
texts tokenizes in a few ms on one thread, and 8 threads keep up with any one device's intake."""


def host_reserve_cores(share_cores: float) -> int:
    """Whole cores kept off torch's intra-op pool for the host path on a CPU-only host.

    ``share_cores`` ≤ 2: 0. Measured on this project's 2-core machine with the broker and the
    load client on the same cores (BENCHMARKS.md "CPU budget"): one torch thread and a core
    kept drained 0.9× two threads and did not lower p99 at the same fractions of drain, so two
    cores keep nothing. Above 2: ``clamp(ceil(share / 8), 1, 4)`` — 1 core up to 8 (the event
    loop uses at most one core, the tokenizer ~0.03 core at 114 requests/s), 2 up to 16, at
    most 4; vLLM's CPU backend keeps one core by default. Not measured here (no such host).
    """
    if share_cores <= 2:
        return 0
    return max(1, min(4, math.ceil(share_cores / 8)))


@dataclass(frozen=True)
class ThreadPlan:
    """How one process's threads share its CPU budget.

    Attributes:
        budget: the host's (or container's) budget.
        share_cores: this process's part of it (``budget.cores / replicas``).
        accelerator: the model runs on a GPU (or a simulated device): torch's CPU pool only
            launches work, so it gets one thread and the tokenizer gets the rest.
        torch_threads: torch intra-op threads (also ONNX Runtime's intra-op threads).
        torch_interop_threads: torch inter-op threads (1: kbatch runs one forward at a time).
        tokenizer_threads: the tokenizer's Rayon pool (1: ``encode_batch`` runs serially in
            the tokenizer thread, no pool at all).
        host_reserve_cores: cores kept off torch's pool for the event loop, the tokenizer and
            the Kafka client.
        torch_from: what set ``torch_threads``: ``plan``, ``--torch-threads`` (or
            ``KBATCH_TORCH_THREADS``), or the operator's ``OMP_NUM_THREADS``.
        tokenizer_from: what set ``tokenizer_threads``: ``plan``, or the operator's
            ``RAYON_NUM_THREADS`` / ``TOKENIZERS_PARALLELISM``.
    """

    budget: CpuBudget
    share_cores: float
    accelerator: bool
    torch_threads: int
    torch_interop_threads: int
    tokenizer_threads: int
    host_reserve_cores: int
    torch_from: str = "plan"
    tokenizer_from: str = "plan"

    @property
    def torch_threads_set(self) -> bool:
        """Something other than the rule set torch's threads."""
        return self.torch_from != "plan"

    def pools(self) -> dict[str, int]:
        """Pool name → threads, as ``kbatch_threads{pool}`` shows them (the event loop is one
        thread, the tokenizer stage one worker thread calling the Rayon pool)."""
        return {
            "torch": self.torch_threads,
            "torch_interop": self.torch_interop_threads,
            "tokenizer": self.tokenizer_threads,
            "event_loop": 1,
        }

    def describe(self) -> str:
        """One start-up line, e.g. ``torch 1 (+1 inter-op), tokenizer 1, 1 core kept for the
        event loop, tokenizer and Kafka``."""
        torch = f"torch {self.torch_threads}" + _from(self.torch_from)
        tokenizer = f"tokenizer {self.tokenizer_threads}" + _from(self.tokenizer_from)
        kept = (
            f"{cores_text(self.host_reserve_cores)} kept for the event loop, tokenizer and Kafka"
            if self.host_reserve_cores
            else "no core kept for the host path"
        )
        where = "accelerator host" if self.accelerator else "CPU host"
        if self.budget.thread_cores > self.budget.cores and not self.accelerator:
            where += f", threads may span {cores_text(self.budget.thread_cores)} under the quota"
        return (
            f"a share of {self.share_cores:g} of {cores_text(self.budget.cores)} ({where}): "
            f"{torch} (+{self.torch_interop_threads} inter-op), {tokenizer}, {kept}"
        )


def _from(source: str) -> str:
    return "" if source == "plan" else f" ({source})"


PLANNED_ENV = "_KBATCH_PLANNED_THREAD_ENV"
"""Where :func:`apply_native_env` notes what it set (``NAME=value;…``), so that kbatch's own
values are never read back as the operator's: not by a second model load in the process, nor by
a child process that inherits the environment (a test suite, a script that runs serve). Its
name does not start with ``KBATCH_``, so no settings source reads it."""


def _planned(environ: Mapping[str, str]) -> dict[str, str]:
    pairs = (item.partition("=") for item in environ.get(PLANNED_ENV, "").split(";") if item)
    return {name: value for name, _, value in pairs}


def _operators(environ: Mapping[str, str], name: str) -> str | None:
    """The operator's value of ``name``: None when unset or when it is the one kbatch set."""
    value = environ.get(name)
    if value is None or _planned(environ).get(name) == value:
        return None
    return value


def _env_count(environ: Mapping[str, str], name: str) -> int | None:
    """A positive thread count the operator put in ``name``, else None (unset, kbatch's own,
    or not a positive integer)."""
    try:
        n = int(_operators(environ, name) or "")
    except ValueError:
        return None
    return n if n >= 1 else None


_FALSE = frozenset({"0", "false", "off", "no"})


def plan_threads(
    budget: CpuBudget,
    *,
    replicas: int = 1,
    accelerator: bool = False,
    torch_threads: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> ThreadPlan:
    """Size every pool of one process from the budget (pure).

    CPU host, share ``S = budget / replicas``: torch gets ``max(1, floor(T) - reserve)``
    threads, where ``T = budget.thread_cores / replicas`` (``S``, or up to
    :data:`~consumer.cpu.budget.QUOTA_BURST` × ``S`` under a cgroup quota) and
    ``reserve = host_reserve_cores(S)``; the tokenizer's Rayon pool gets ``reserve`` cores, or
    when nothing is kept as many threads as torch (they take turns on the same cores).
    Accelerator host: torch 1 thread, the tokenizer ``clamp(floor(S) - 1, 1, 8)`` (one core
    for the event loop). ``torch_threads``
    (``--torch-threads``) overrides torch's count and nothing else. The operator's environment
    (``environ``, e.g. ``os.environ``) overrides the rule next: ``OMP_NUM_THREADS`` torch's
    count (as torch's own default reads it), ``RAYON_NUM_THREADS`` the tokenizer's, and
    ``TOKENIZERS_PARALLELISM=false`` makes the tokenizer serial.

    Raises:
        ValueError: ``replicas`` < 1 or ``torch_threads`` < 1.
    """
    if replicas < 1:
        raise ValueError(f"replicas={replicas}: at least 1")
    if torch_threads is not None and torch_threads < 1:
        raise ValueError(f"--torch-threads {torch_threads}: at least 1")
    share = budget.cores / replicas
    whole = max(1, math.floor(share))
    span = max(1, math.floor(budget.thread_cores / replicas))
    if accelerator:
        reserve = 1 if whole >= 2 else 0
        torch_n = 1
        tokenizer = max(1, min(GPU_TOKENIZER_MAX_THREADS, whole - 1))
    else:
        reserve = host_reserve_cores(share)
        torch_n = max(1, span - reserve)
        # nothing kept: the tokenizer takes turns with torch on the same cores (measured in a
        # 1-CPU cgroup: a serial tokenizer queued big poll chunks, p99 966-1,449 ms against
        # 499-616 with a pool as wide as torch's)
        tokenizer = reserve if reserve else torch_n
    env = environ or {}
    torch_from, tokenizer_from = "plan", "plan"
    if torch_threads is not None:
        torch_n, torch_from = torch_threads, "--torch-threads"
    elif (omp := _env_count(env, "OMP_NUM_THREADS")) is not None:
        torch_n, torch_from = omp, "OMP_NUM_THREADS"
    parallelism = "TOKENIZERS_PARALLELISM"
    if (_operators(env, parallelism) or "").lower() in _FALSE:
        tokenizer, tokenizer_from = 1, f"{parallelism}={env[parallelism]}"
    elif (rayon := _env_count(env, "RAYON_NUM_THREADS")) is not None:
        tokenizer, tokenizer_from = rayon, "RAYON_NUM_THREADS"
    return ThreadPlan(
        budget=budget,
        share_cores=share,
        accelerator=accelerator,
        torch_threads=torch_n,
        torch_interop_threads=1,
        tokenizer_threads=tokenizer,
        host_reserve_cores=reserve,
        torch_from=torch_from,
        tokenizer_from=tokenizer_from,
    )


def apply_native_env(
    plan: ThreadPlan, environ: MutableMapping[str, str] | None = None
) -> dict[str, str]:
    """Set the variables native thread pools read when they start; returns what was set.

    Call before the first tokenization (Rayon builds its global pool on first use and reads
    ``RAYON_NUM_THREADS`` then; ``TOKENIZERS_PARALLELISM=false`` runs ``encode_batch`` without
    the pool when it would have one thread) and before torch/ONNX Runtime start their pools
    (``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``). A variable the operator already set is left
    alone: the environment overrides the plan. What kbatch set is noted in
    :data:`PLANNED_ENV`.
    """
    env = os.environ if environ is None else environ
    wanted = {
        "RAYON_NUM_THREADS": str(plan.tokenizer_threads),
        "OMP_NUM_THREADS": str(plan.torch_threads),
        "MKL_NUM_THREADS": str(plan.torch_threads),
    }
    if plan.tokenizer_threads == 1:
        wanted["TOKENIZERS_PARALLELISM"] = "false"
    planned = _planned(env)
    applied: dict[str, str] = {}
    for name in ("TOKENIZERS_PARALLELISM", *wanted):
        ours = name in env and planned.get(name) == env[name]
        if name not in wanted:  # a pool of several threads: drop kbatch's earlier "false"
            if ours:
                del env[name]
                del planned[name]
            continue
        if name not in env or ours:
            env[name] = planned[name] = applied[name] = wanted[name]
    env[PLANNED_ENV] = ";".join(f"{name}={value}" for name, value in sorted(planned.items()))
    return applied


def budget_cores_whole() -> int:
    """This process's CPU budget in whole cores (at least 1), with nothing kept for a host
    path: the default torch threads of the benchmarks that run the model alone in-process
    (``kbatch bench engine``, ``bench quality``, ``bench e2e``'s ``engine``)."""
    from consumer.cpu.budget import read_cpu_budget

    return max(1, math.floor(read_cpu_budget().cores))
