"""Which thread of this process spends the CPU: OS thread names, and CPU seconds by role.

On a GPU host every core that feeds the device belongs to the host path (Kafka, decode,
tokenizer, replies); whether the event loop, the consumer's owner thread, the model thread or
librdkafka's threads spend it decides what to change. Python 3.11 does not name OS threads, so
``top -H``, ``ps -L`` and ``/proc`` showed every kbatch thread as ``kbatch``:
:func:`name_os_thread` gives each one its role's name (librdkafka names its own, ``rdk:…``), and
:class:`ThreadCpu` sums ``/proc/self/task/*/stat`` by role for
``kbatch_thread_cpu_seconds_total``.

Linux only: elsewhere threads keep their names and no CPU is reported.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import sys
from pathlib import Path
from typing import Final

__all__ = ["ROLES", "ThreadCpu", "name_os_thread", "role_of"]

_PR_SET_NAME: Final = 15
_NAME_BYTES: Final = 15  # the kernel keeps 16 bytes with the terminating NUL

ROLES: Final = {
    "kbatch-model": "model",
    "kbatch-tokenize": "tokenizer",
    "kbatch-collate": "collate",
    "kbatch-source": "kafka_consumer",
    "kbatch-http": "http",
}
"""OS thread name → role (``kbatch_thread_cpu_seconds_total``'s ``thread`` label). The main
thread is ``event_loop``, librdkafka's ``rdk:…`` threads ``librdkafka``, a backfill job's
consumer (``kbatch-job …``) ``jobs``; any other thread (torch's, a blocking call's) ``other``."""

_libc: ctypes.CDLL | None = None


def name_os_thread(name: str) -> None:
    """Name the calling OS thread ``name`` (cut to 15 bytes, as the kernel keeps it): what
    ``top -H``, ``ps -L`` and ``/proc/<pid>/task/<tid>/comm`` show. Never raises; does
    nothing off Linux."""
    global _libc
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError, TypeError):
        if _libc is None:
            _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        _libc.prctl(_PR_SET_NAME, name.encode()[:_NAME_BYTES], 0, 0, 0)


def role_of(comm: str, *, main: bool) -> str:
    """The role of a thread named ``comm`` (``main``: the process's first thread)."""
    if main:
        return "event_loop"
    if comm.startswith("rdk:"):
        return "librdkafka"
    if comm.startswith("kbatch-job"):
        return "jobs"
    return ROLES.get(comm, "other")


def _read_task(task: Path) -> tuple[str, int] | None:
    """``(comm, utime + stime in clock ticks)`` of one ``/proc/<pid>/task/<tid>``; None when
    the thread ended meanwhile."""
    try:
        stat = (task / "stat").read_text()
    except OSError:
        return None
    # "tid (comm) state ppid …": comm may hold spaces and parentheses; it ends at the last ")".
    close = stat.rfind(")")
    comm = stat[stat.find("(") + 1 : close]
    fields = stat[close + 2 :].split()
    return comm, int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)


class ThreadCpu:
    """CPU seconds spent by each role's threads since construction, from
    ``/proc/<pid>/task``.

    :meth:`sample` returns the seconds each role spent since the previous call (a thread that
    ended keeps what it spent before; its last ticks after the previous sample are lost), so
    the sum of the samples only grows, as a Prometheus counter's.

    Args:
        tasks: ``/proc/<pid>/task`` (a fake tree in tests).
        pid: the process id (its main thread's tid).
        ticks_per_s: ``SC_CLK_TCK``.
    """

    def __init__(
        self,
        tasks: Path | None = None,
        *,
        pid: int | None = None,
        ticks_per_s: float | None = None,
    ) -> None:
        self._pid = os.getpid() if pid is None else pid
        self._tasks = Path(f"/proc/{self._pid}/task") if tasks is None else tasks
        self._ticks_per_s = float(os.sysconf("SC_CLK_TCK")) if ticks_per_s is None else ticks_per_s
        self._last: dict[int, int] = {}  # tid → ticks at the previous sample
        self.available = self._tasks.is_dir()
        if self.available:
            self.sample()  # what threads spent before this counts as before

    def sample(self) -> dict[str, float]:
        """Seconds per role since the previous call (roles with nothing spent left out);
        empty where ``/proc`` is not there."""
        if not self.available:
            return {}
        spent: dict[str, float] = {}
        seen: dict[int, int] = {}
        try:
            tasks = list(self._tasks.iterdir())
        except OSError:
            return {}
        for task in tasks:
            try:
                tid = int(task.name)
            except ValueError:
                continue
            read = _read_task(task)
            if read is None:
                continue
            comm, ticks = read
            seen[tid] = ticks
            delta = ticks - self._last.get(tid, 0)
            if delta > 0:
                role = role_of(comm, main=tid == self._pid)
                spent[role] = spent.get(role, 0.0) + delta / self._ticks_per_s
        self._last = seen
        return spent
