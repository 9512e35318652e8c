"""Parts on an exit stack: stopped in reverse, each within the one shutdown deadline, and the
whole shutdown (drain + stops) inside ``drain_timeout_s``."""

from __future__ import annotations

import asyncio
import contextlib

from consumer.lifecycle import CLOSE_RESERVE_S, Lifecycle
from tests.fakes import FakeClock


async def test_parts_stop_in_reverse_order_sync_and_async() -> None:
    stopped: list[str] = []

    async def stop_async(name: str) -> None:
        stopped.append(name)

    async with contextlib.AsyncExitStack() as stack:
        life = Lifecycle(stack, 5.0)
        life.enter("metrics server", lambda: stopped.append("metrics server"))
        for name in ("engine", "producer", "consumer"):
            life.enter(name, lambda n=name: stop_async(n))  # type: ignore[misc]
    assert stopped == ["consumer", "producer", "engine", "metrics server"]


async def test_a_hung_stop_is_abandoned_at_the_shutdown_deadline_and_the_rest_still_stop() -> None:
    loop = asyncio.get_running_loop()
    stopped: list[str] = []
    hung = asyncio.Event()  # never set

    async with contextlib.AsyncExitStack() as stack:
        life = Lifecycle(stack, 0.3, loop.time)
        life.enter("engine", lambda: stopped.append("engine"))
        life.enter("consumer", hung.wait)  # type: ignore[arg-type]
        started = loop.time()
        drain = life.drain_deadline()
        shutdown = life.begin_shutdown()
        assert shutdown.remaining_s() - drain.remaining_s() >= 0.3 / 4 - 0.01  # the reserve
    elapsed = loop.time() - started
    assert stopped == ["engine"]
    assert elapsed < 0.3 + 0.2  # inside the one budget, not a second timeout per step


def test_the_drain_keeps_the_close_reserve_of_a_long_budget() -> None:
    clock = FakeClock()
    life = Lifecycle(contextlib.AsyncExitStack(), 30.0, clock)
    assert life.drain_deadline().remaining_s() == 30.0 - CLOSE_RESERVE_S
    clock.now_s += 10.0  # the shutdown deadline started at the first call
    assert life.begin_shutdown().remaining_s() == 20.0


def test_a_zombie_is_not_running_and_this_process_is() -> None:
    """:func:`consumer.lifecycle.process_running`, the one life check (broker pid file, the
    sweep): an exited child not yet reaped is a zombie, not a running process."""
    import os
    import subprocess
    import time

    from consumer.lifecycle import process_running

    assert process_running(os.getpid())
    child = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 10
        while process_running(child.pid):  # until it exits (a zombie: nobody reaped it yet)
            assert time.monotonic() < deadline, "the child never exited"
            time.sleep(0.01)
        assert child.returncode is None  # not reaped: the check saw a zombie, not a gone pid
    finally:
        child.wait()
    assert not process_running(child.pid)
