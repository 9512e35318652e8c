"""Start a command's parts in order, stop them in reverse, all within one shutdown deadline.

``kbatch serve`` and ``kbatch backfill`` enter each part on a :class:`contextlib.AsyncExitStack`
once it has started (:meth:`Lifecycle.enter`); leaving the stack stops them in reverse order,
each stop bounded by what is left of the one shutdown :class:`~consumer.deadline.Deadline`
(:meth:`Lifecycle.begin_shutdown`). The drain before the stops spends
:meth:`Lifecycle.drain_deadline`: the shutdown deadline less :data:`CLOSE_RESERVE_S`, kept for
the stops, so the whole shutdown — drain, commit and closes — fits ``drain_timeout_s``
(quix-streams ``app.py`` and ``checkpointing/deadline.py``; aiokafka's idempotent ``stop``).

Every stop given to :meth:`Lifecycle.enter` must be idempotent (a part may be stopped by its
owner too). :func:`process_running` is the one check of another process's life (a broker's
pid file, a killed supervisor's folder); :func:`supervisor_pid` tells a replica of
``serve --replicas N`` from a process started alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import os
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from consumer.deadline import Deadline

__all__ = [
    "CLOSE_RESERVE_S",
    "STOP_NOW_HINT",
    "SUPERVISOR_PID_ENV",
    "Lifecycle",
    "process_running",
    "stop_on_signals",
    "supervisor_pid",
    "unless_stopped_now",
]

log = logging.getLogger(__name__)

CLOSE_RESERVE_S = 3.0
"""Seconds of the shutdown deadline kept for stopping the parts after the drain (leaving the
group cleanly spares the next owner a session timeout), at most a quarter of the budget."""

Stop = Callable[[], Awaitable[None] | None]
T = TypeVar("T")

SUPERVISOR_PID_ENV = "KBATCH_SUPERVISOR_PID"
"""Environment variable the supervisor of ``serve --replicas N`` sets for each replica: its own
pid (decimal)."""


def supervisor_pid(environ: Mapping[str, str] = os.environ) -> int | None:
    """The supervisor's pid from :data:`SUPERVISOR_PID_ENV`, or None for a process that is not a
    replica (the variable unset, empty or not a positive integer)."""
    raw = environ.get(SUPERVISOR_PID_ENV, "").strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else None


def process_running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (Linux's ``/proc``; elsewhere a
    signal 0, which counts a zombie as running). Another user's process counts as running."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


STOP_NOW_HINT = "Ctrl-C again stops now"
"""How a drain's log line says that a second SIGINT abandons it (:func:`stop_on_signals`)."""


def stop_on_signals(now: asyncio.Event | None = None) -> asyncio.Event:
    """An event that SIGTERM and SIGINT set (handlers on the running loop): a command's stop.

    With ``now``: a SIGINT after the stop (a second Ctrl-C) sets ``now``, the command's "stop
    now, abandon the drain", and gives SIGINT back to Python (a third raises
    ``KeyboardInterrupt`` wherever the process is). A second SIGTERM changes nothing: an
    orchestrator's stop is drained within ``drain_timeout_s``.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_sigint() -> None:
        if now is not None and stop.is_set():
            now.set()
            loop.remove_signal_handler(signal.SIGINT)
        stop.set()

    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, on_sigint)
    return stop


async def unless_stopped_now(work: Awaitable[T], now: asyncio.Event) -> tuple[bool, T | None]:
    """Await ``work`` unless ``now`` is set first (then ``work`` is cancelled): (True, its
    result), or (False, None) when it was abandoned."""
    task = asyncio.ensure_future(work)
    stopping = asyncio.ensure_future(now.wait())
    try:
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        stopping.cancel()
    if task.done():
        return True, task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return False, None


@dataclass(eq=False)
class Lifecycle:
    """The parts of one command on an exit stack, and its one shutdown deadline.

    Attributes:
        stack: entered by the caller (``async with AsyncExitStack() as stack``).
        shutdown_timeout_s: the whole shutdown's budget (``drain_timeout_s``), counted from
            :meth:`begin_shutdown`.
        clock: monotonic seconds (the event loop's clock is the same).
    """

    stack: contextlib.AsyncExitStack
    shutdown_timeout_s: float
    clock: Callable[[], float] = time.monotonic
    _deadline: Deadline | None = field(default=None, init=False)

    def enter(self, name: str, stop: Stop) -> None:
        """Stop this started part (``stop``, sync or async) when the stack is left, bounded by
        the shutdown deadline; a stop that overruns it is logged and abandoned."""
        self.stack.push_async_callback(self._stop, name, stop)

    def begin_shutdown(self) -> Deadline:
        """The shutdown deadline, started by the first call (later calls return it)."""
        if self._deadline is None:
            self._deadline = Deadline.after(self.shutdown_timeout_s, self.clock)
        return self._deadline

    def drain_deadline(self) -> Deadline:
        """The part of the shutdown deadline for the drain (:data:`CLOSE_RESERVE_S` kept)."""
        return self.begin_shutdown().keeping(CLOSE_RESERVE_S)

    async def _stop(self, name: str, stop: Stop) -> None:
        left_s = self.begin_shutdown().remaining_s()
        try:
            result = stop()
            if inspect.isawaitable(result):
                await asyncio.wait_for(result, None if math.isinf(left_s) else left_s)
        except TimeoutError:
            log.warning("%s did not stop by the shutdown deadline", name)
