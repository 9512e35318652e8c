"""A replica drains when its supervisor is gone (``consumer.serve.supervisor_watch``)."""

from __future__ import annotations

import asyncio

import pytest

from consumer.lifecycle import SUPERVISOR_PID_ENV, supervisor_pid
from consumer.serve.supervisor_watch import watch_supervisor


@pytest.mark.parametrize(
    ("value", "expected"),
    [("4242", 4242), (" 17 ", 17), ("", None), ("0", None), ("-3", None), ("pid", None)],
)
def test_the_supervisor_pid_comes_from_the_environment(value: str, expected: int | None) -> None:
    assert supervisor_pid({SUPERVISOR_PID_ENV: value}) == expected


def test_a_process_without_the_variable_is_no_replica() -> None:
    assert supervisor_pid({}) is None


async def test_stop_is_set_once_the_parent_changes() -> None:
    parents = iter([100, 100, 1])  # re-parented to init on the third check
    stop = asyncio.Event()
    await asyncio.wait_for(
        watch_supervisor(stop, 100, getppid=lambda: next(parents), interval_s=0), 5
    )
    assert stop.is_set()


async def test_the_watch_ends_with_the_serve_and_leaves_stop_alone_while_the_parent_lives() -> None:
    checks = 0

    def parent() -> int:
        nonlocal checks
        checks += 1
        return 100

    stop = asyncio.Event()
    watch = asyncio.create_task(watch_supervisor(stop, 100, getppid=parent, interval_s=0.001))
    while checks < 3:
        await asyncio.sleep(0)
    assert not watch.done() and not stop.is_set()
    stop.set()  # SIGTERM: the serve stops for another reason
    await asyncio.wait_for(watch, 5)
    assert checks >= 3
