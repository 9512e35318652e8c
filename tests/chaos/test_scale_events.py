"""Scale events under a constant load: the stall the whole group sees and the p99 latency while
the group goes 1 -> 2 -> 3 -> 2 members, without and with static membership (``make chaos``).

aiokafka rebalances eagerly: every join or leave revokes every partition of every member, so
each event stalls the group. The figures go to docs/CLUSTER.md §Scale events.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from tests.chaos.history import quantile
from tests.chaos.scenario import longest_gap
from tests.chaos.workload import Workload, close_history
from tests.conftest import TopicFactory, unique_group
from tests.integration.harness import ServeProcess

pytestmark = [pytest.mark.chaos_long, pytest.mark.timeout(900)]

SETTLE_S = 8.0


@pytest.mark.parametrize("mode", ["dynamic", "static", "static-leave"])
async def test_scale_1_2_3_2_stalls_and_p99(
    tmp_path: Path,
    kafka_bootstrap: str,
    new_topic: TopicFactory,
    tiny_embed_dir: Path,
    mode: str,
) -> None:
    # static-leave: static members with --leave-group-on-shutdown (the scale-down leaves).
    static = mode != "dynamic"
    req, rep, dlq = await new_topic("req", 6), await new_topic("rep", 3), await new_topic("dlq")
    group = unique_group("scale")

    def member(i: int) -> ServeProcess:
        extra = ["--group-instance-id", f"m-{i}"] if static else []
        if mode == "static-leave":
            extra.append("--leave-group-on-shutdown")
        return ServeProcess.start(
            tmp_path, bootstrap=kafka_bootstrap, request_topic=req, reply_topic=rep,
            dlq_topic=dlq, group_id=group, model=str(tiny_embed_dir), name=f"m{i}", extra=extra,
        )  # fmt: skip

    members = [member(0)]
    load = Workload(kafka_bootstrap, req, rep, rate_per_s=30)
    events: list[tuple[str, float, float]] = []  # (event, start, end of its window)
    try:
        await asyncio.to_thread(members[0].wait_ready)
        load.start()
        await asyncio.to_thread(time.sleep, SETTLE_S)  # steady load before the first event
        for step in ("1->2", "2->3", "3->2"):
            started = time.monotonic()
            if step == "3->2":
                leaving = members.pop()
                leaving.signal(signal.SIGTERM)
                await asyncio.to_thread(leaving.wait, 60)
            else:
                members.append(member(len(members)))
                await asyncio.to_thread(members[-1].wait_ready)
            await asyncio.to_thread(time.sleep, SETTLE_S)  # the load runs on; the window
            events.append((step, started, time.monotonic()))
        load.stop_producing()
        await asyncio.to_thread(load.wait_seen, 180)
        for m in members:  # no member was fenced or dropped out by the events
            assert m.proc is not None and m.proc.poll() is None, m.log_tail()
    finally:
        load.stop()
        for m in members:
            m.stop()
    h = load.history
    seen = list(h.first_seen_at.values())
    figures = []
    for step, start, end in events:
        keys = [k for k, at in h.acked_at.items() if start <= at <= end]
        latencies = [h.first_seen_at[k] - h.acked_at[k] for k in keys]
        figures.append(
            f"{step}: stall {longest_gap(seen, start, end):.1f} s, "
            f"p99 {quantile(latencies, 0.99):.2f} s"
        )
    print(f"\nscale ({mode}): " + "; ".join(figures))
    await close_history(h, kafka_bootstrap, rep, 3)
    assert not h.check().lost
