"""A replica of ``kbatch serve --replicas N`` stops when its supervisor is gone.

The supervisor (:mod:`consumer.serve.replicas`) forwards SIGTERM/SIGINT, but a supervisor killed
with SIGKILL (or by the OOM killer) forwards nothing: without this watch its replicas would run on
as orphans, still members of the consumer group, and a restarted supervisor would add N more.
So each replica learns its supervisor's pid (:func:`consumer.lifecycle.supervisor_pid`) and
checks its parent pid every :data:`WATCH_INTERVAL_S`: once the parent is no longer that
process (an orphan is re-parented to init or a subreaper), the replica drains and exits as on
SIGTERM — its answered records are committed, the rest are re-read by the group's next owner.

Polling ``getppid`` is portable and needs no privileges; Linux's ``PR_SET_PDEATHSIG`` would
signal sooner but is tied to the forking *thread* and to Linux.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable

__all__ = ["WATCH_INTERVAL_S", "watch_supervisor"]

log = logging.getLogger("kbatch.replicas")

WATCH_INTERVAL_S = 1.0
"""Seconds between two parent-pid checks: how long an orphaned replica runs on at most before
its drain begins."""


async def watch_supervisor(
    stop: asyncio.Event,
    pid: int,
    *,
    getppid: Callable[[], int] = os.getppid,
    interval_s: float = WATCH_INTERVAL_S,
) -> None:
    """Set ``stop`` (the serve's SIGTERM event) once this process's parent is no longer ``pid``;
    return when ``stop`` is set either way. Checks at once, then every ``interval_s`` seconds.
    """
    while not stop.is_set():
        if getppid() != pid:
            log.error("the supervisor (pid %d) is gone: draining and stopping", pid)
            stop.set()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
