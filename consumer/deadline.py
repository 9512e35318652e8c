"""One deadline for a shutdown or handover, created once and passed down to every step.

A drain (SIGTERM) or a revoke (rebalance) has one time budget — ``drain_timeout_s``, or the
revoke's share of ``rebalance_timeout_ms`` — and several steps: stop forming batches, wait for
answers, commit, close. Each step asks the same :class:`Deadline` how much is left instead of
getting a timeout of its own, so the steps together never overrun the budget (a step given
"the timeout" each would add up). What is not done when it expires is dropped and left
uncommitted for the next owner. The model is quix-streams' ``checkpointing`` deadline and
``distributed``'s ``Deadline.after``: an absolute expiry on a monotonic clock.

Pure: no asyncio (the owner does the waiting, bounded by :meth:`Deadline.remaining_s`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

__all__ = ["Deadline"]


class Deadline:
    """An absolute expiry time on a monotonic clock.

    Args:
        expires_s: the clock reading (seconds) at which it expires; ``math.inf`` = never.
        clock: monotonic seconds (``time.monotonic``; asyncio's default loop clock is the
            same). Tests pass a fake.

    Create it with :meth:`after`. Immutable.
    """

    __slots__ = ("_clock", "expires_s")

    def __init__(self, expires_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.expires_s = expires_s
        self._clock = clock

    @classmethod
    def after(cls, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> Deadline:
        """A deadline ``timeout_s`` seconds from now (``math.inf`` = never expires).

        Raises:
            ValueError: ``timeout_s`` is negative or NaN.
        """
        if not timeout_s >= 0:
            raise ValueError(f"timeout_s must be >= 0, got {timeout_s}")
        return cls(clock() + timeout_s, clock)

    @classmethod
    def never(cls, clock: Callable[[], float] = time.monotonic) -> Deadline:
        """A deadline that never expires (``remaining_s`` is ``math.inf``)."""
        return cls(math.inf, clock)

    def remaining_s(self) -> float:
        """Seconds left, at least 0 (``math.inf`` for :meth:`never`)."""
        return max(0.0, self.expires_s - self._clock())

    @property
    def expired(self) -> bool:
        """True once the clock has reached the expiry time."""
        return self._clock() >= self.expires_s

    def sooner(self, reserve_s: float) -> Deadline:
        """The same clock, expiring ``reserve_s`` earlier (never before now): the part of the
        budget for the work steps, leaving ``reserve_s`` for the last step (the commit)."""
        return Deadline(max(self._clock(), self.expires_s - reserve_s), self._clock)

    def __repr__(self) -> str:
        return f"Deadline(remaining_s={self.remaining_s():.3f})"
