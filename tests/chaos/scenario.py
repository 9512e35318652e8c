"""One chaos scenario end to end: topics, ``kbatch serve``, constant load, a fault, the verdict.

:func:`run_scenario` starts ``kbatch serve`` on the chaos cluster (through the proxies), runs
the :class:`~tests.chaos.workload.Workload`, applies ``fault`` (a blocking function, run in a
thread so this test's loop stays free), keeps the load on for ``after_s``, waits until every
acknowledged request was answered, and closes the history. The figures of
:class:`ScenarioResult` are what ``docs/CLUSTER.md``'s table shows; each run prints one
``chaos-result {...}`` JSON line.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from consumer.kafka.admin import ensure_topics
from tests.chaos.cluster import ChaosCluster
from tests.chaos.history import Verdict
from tests.chaos.nodes import wait_fully_replicated
from tests.chaos.workload import Workload, close_history
from tests.integration.harness import ServeProcess, poll_until

PARTITIONS = 3
REPLICATION = 3


@dataclass(frozen=True)
class Topics:
    requests: str
    replies: str
    dead_letters: str
    group: str

    @classmethod
    def unique(cls, name: str) -> Topics:
        tag = f"{name}.{uuid.uuid4().hex[:8]}"
        return cls(f"chaos.{tag}.req", f"chaos.{tag}.rep", f"chaos.{tag}.dlq", f"chaos-{tag}")


@dataclass(frozen=True)
class ScenarioResult:
    """The figures of one run (the table of docs/CLUSTER.md)."""

    name: str
    acked: int
    lost: int
    duplicates: int
    g1a: int
    unseen: int
    stall_s: float
    """The longest time without any new reply seen live, from the fault's start to the end."""
    recover_s: float
    """From the fault's end until every request acknowledged before it, and the first one
    acknowledged after it, were answered."""
    rebalances: int
    """Revocations the serving members went through (``kbatch_rebalances_total{kind=revoked}``)."""
    recoveries: int
    """``--exactly-once``: partitions whose failed transaction the members recovered in place
    (``kbatch_transaction_recoveries_total``, every reason)."""
    latency_p99_s: float
    verdict: Verdict

    def line(self) -> str:
        figures = {k: v for k, v in asdict(self).items() if k != "verdict"}
        return "chaos-result " + json.dumps(figures)


async def create_topics(cc: ChaosCluster, topics: Topics) -> None:
    await ensure_topics(
        cc.bootstrap,
        {topics.requests: PARTITIONS, topics.replies: PARTITIONS, topics.dead_letters: 1},
        REPLICATION,
    )
    await wait_fully_replicated(cc.bootstrap, [topics.requests, topics.replies], REPLICATION)


def settle(cc: ChaosCluster, topics: Topics) -> None:
    """Block until every partition of the scenario's topics has all replicas in sync again."""
    asyncio.run(
        wait_fully_replicated(cc.bootstrap, [topics.requests, topics.replies], REPLICATION, 120)
    )


def start_serve(
    tmp_path: Path,
    cc: ChaosCluster,
    topics: Topics,
    model_dir: Path,
    *,
    name: str = "serve",
    extra: Sequence[str] = (),
) -> ServeProcess:
    return ServeProcess.start(
        tmp_path,
        bootstrap=cc.bootstrap,
        request_topic=topics.requests,
        reply_topic=topics.replies,
        dlq_topic=topics.dead_letters,
        group_id=topics.group,
        model=str(model_dir),
        name=name,
        extra=list(extra),
    )


def network_cut(seconds: float) -> Callable[[ChaosCluster, Topics], None]:
    """The fault "every link between kbatch and the cluster cut for ``seconds``, then healed"."""

    def cut(cc: ChaosCluster, topics: Topics) -> None:
        cc.proxies.cut()
        time.sleep(seconds)  # the fault's length, not a synchronisation
        cc.proxies.heal()

    return cut


def revocations(server: ServeProcess) -> int:
    return int(server.metrics().get('kbatch_rebalances_total{kind="revoked"}', 0.0))


def recoveries(server: ServeProcess) -> int:
    """``kbatch_transaction_recoveries_total`` summed over its reasons."""
    samples = server.metrics().items()
    return int(sum(v for k, v in samples if k.startswith("kbatch_transaction_recoveries_total")))


def longest_gap(times: list[float], start: float, end: float) -> float:
    """The longest interval in ``[start, end]`` without a time of ``times`` (sorted inside)."""
    points = [start, *sorted(t for t in times if start < t < end), end]
    return max(b - a for a, b in itertools.pairwise(points))


async def run_scenario(
    name: str,
    cc: ChaosCluster,
    tmp_path: Path,
    model_dir: Path,
    fault: Callable[[ChaosCluster, Topics], None],
    *,
    rate_per_s: float = 30.0,
    warm_s: float = 3.0,
    after_s: float = 5.0,
    answer_timeout_s: float = 180.0,
    exactly_once: bool = False,
    extra: Sequence[str] = (),
    members: int = 1,
    ready_after: bool = False,
) -> ScenarioResult:
    """Run ``fault`` under load against ``members`` ``kbatch serve`` processes of one group
    (static ids ``<group>-<i>`` when more than one); returns the figures.

    ``ready_after``: every member's ``/readyz`` must answer 200 again once everything is
    answered (within 60 s).

    Raises:
        AssertionError: a member died, or the acknowledged requests were not all answered in
            ``answer_timeout_s`` (the message says how many were missing).
    """
    topics = Topics.unique(name)
    await create_topics(cc, topics)
    serve_extra = [*extra, *(["--exactly-once"] if exactly_once else [])]
    servers = [
        start_serve(
            tmp_path,
            cc,
            topics,
            model_dir,
            name=f"serve-{i}",
            extra=[*serve_extra, *(["--group-instance-id", f"{topics.group}-{i}"] * (members > 1))],
        )
        for i in range(members)
    ]
    load = Workload(
        cc.bootstrap,
        topics.requests,
        topics.replies,
        rate_per_s=rate_per_s,
        read_committed=exactly_once,
    )
    try:
        for server in servers:
            await asyncio.to_thread(server.wait_ready, 120)
        before = sum(revocations(server) for server in servers)
        load.start()
        await asyncio.to_thread(
            poll_until, lambda: load.seen_count() >= rate_per_s * warm_s, 60, "replies under load"
        )
        fault_start = time.monotonic()
        await asyncio.to_thread(fault, cc, topics)
        fault_end = time.monotonic()
        print(f"\n{name}: fault took {fault_end - fault_start:.1f} s")
        await asyncio.to_thread(time.sleep, after_s)  # the load runs on after the fault
        await asyncio.to_thread(load.stop_producing)
        await asyncio.to_thread(load.wait_seen, answer_timeout_s)
        for server in servers:
            assert server.proc is not None and server.proc.poll() is None, server.log_tail()
            if ready_after:
                await asyncio.to_thread(server.wait_ready, 60)
        rebalances = sum(revocations(server) for server in servers) - before
        recovered = sum(recoveries(server) for server in servers)
    finally:
        load.stop()
        for server in servers:
            server.stop()
        await asyncio.to_thread(cc.heal_all)
    history = load.history
    await close_history(history, cc.bootstrap, topics.replies, PARTITIONS)
    verdict = history.check()
    seen = list(history.first_seen_at.values())
    # Recovered: every request acknowledged before the fault's end answered, and the first
    # request acknowledged after it answered too (replies flow again).
    before_end = [k for k, at in history.acked_at.items() if at <= fault_end]
    after_end = sorted((at, k) for k, at in history.acked_at.items() if at > fault_end)[:1]
    answered_at = [
        history.first_seen_at[k]
        for k in [*before_end, *(k for _at, k in after_end)]
        if k in history.first_seen_at
    ]
    summary = verdict.summary()
    result = ScenarioResult(
        name=name,
        acked=verdict.acked,
        lost=int(summary["lost"]),
        duplicates=int(summary["duplicates"]),
        g1a=int(summary["g1a"]),
        unseen=int(summary["unseen"]),
        stall_s=round(longest_gap(seen, fault_start, max(seen, default=fault_end)), 2),
        recover_s=round(max(0.0, max(answered_at, default=fault_end) - fault_end), 2),
        rebalances=rebalances,
        recoveries=recovered,
        latency_p99_s=float(summary["latency_p99_s"]),
        verdict=verdict,
    )
    print(f"\n{result.line()}")
    return result
