"""Say why a serve that has joined its group gets no partitions for a while.

A member that ended without leaving its group (``kill -9``, a crash, a lost host) keeps its
partitions until the group coordinator gives up on it: its session timeout (the classic
protocol's ``--session-timeout-ms``, 30 s by default; under ``--group-protocol consumer`` the
broker's ``group.consumer.session.timeout.ms``, 45 s by default). A serve restarted in its place
waits that long for them, ``/readyz`` answers 503 meanwhile, and nothing said why. After
:data:`HINT_AFTER_S` without an assignment, one INFO line says so, once per process.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

__all__ = ["HINT_AFTER_S", "unassigned_hint", "watch_first_assignment"]

log = logging.getLogger("kbatch")

HINT_AFTER_S = 10.0
"""Seconds without partitions after the serve started consuming before the line is logged (a
rebalance of a live group takes a few seconds: no line then)."""


def unassigned_hint(
    group_id: str, waited_s: float, session_timeout_ms: int, group_protocol: str
) -> str:
    """The line for a member of ``group_id`` that has had no partitions for ``waited_s``."""
    if group_protocol == "consumer":
        timeout = "the broker's group.consumer.session.timeout.ms (45 s by default)"
    else:
        timeout = f"its session timeout (--session-timeout-ms {session_timeout_ms})"
    return (
        f"no partitions assigned {waited_s:g} s after joining group {group_id!r}: a member "
        "that ended without leaving (kill -9, a crash) keeps its partitions until "
        f"{timeout}; a replica restarted with the same --group-instance-id takes them back "
        "at once"
    )


async def watch_first_assignment(
    assigned: Callable[[], bool],
    group_id: str,
    session_timeout_ms: int,
    group_protocol: str,
    *,
    after_s: float = HINT_AFTER_S,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> bool:
    """Log :func:`unassigned_hint` once when ``assigned()`` is still False ``after_s`` seconds
    from now; returns whether it did."""
    await sleep(after_s)
    if assigned():
        return False
    log.info("%s", unassigned_hint(group_id, after_s, session_timeout_ms, group_protocol))
    return True
