"""Lag in seconds: how long each partition's backlog takes at its recent answer rate (pure).

The numbers behind ``kbatch_partition_lag_seconds`` and ``kbatch_lag_seconds``
(:mod:`consumer.serve.metrics`). A partition's *answer rate* is how fast its lag base (the
committed offset; before the first commit, the first offset taken) moved over the last
``window_s`` seconds, in offsets per second: what was answered and committed, the same unit as
``kbatch_consumer_lag``. Monotonic seconds are passed in; nothing here reads a clock.

What the values say:

- ``0``: no backlog (lag 0), whatever the rate.
- ``lag / rate``: seconds to answer the backlog if the rate holds (a partition's own rate for
  its value; the sum of the lags over the sum of the rates for the member's).
- ``cap_s`` (86,400 s by default): a backlog and no answer in the window — a partition just
  assigned, paused by backpressure for the whole window, or stuck (a stalled model); also any
  estimate longer than the cap.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field

WINDOW_S = 60.0
"""Seconds of answer history behind the rate: long enough to span several commits
(``--commit-interval-ms``, 1 s by default) and batches, short enough to follow a change of load."""

CAP_S = 86_400.0
"""The value for a backlog that is not moving (one day)."""


@dataclass
class _Partition:
    samples: deque[tuple[float, int]] = field(default_factory=deque)  # (now_s, lag base)
    lag: float = 0.0


class LagSeconds:
    """Per-partition windows of the lag base, and the lag seconds they give.

    :meth:`observe` is called for every assigned partition at each lag refresh (once a second
    in serve); :meth:`forget` when a partition moves to another member.
    """

    def __init__(self, window_s: float = WINDOW_S, cap_s: float = CAP_S) -> None:
        self.window_s = window_s
        self.cap_s = cap_s
        self._partitions: dict[Hashable, _Partition] = {}

    def observe(self, now_s: float, tp: Hashable, base_offset: int, lag: float) -> float:
        """Record ``tp``'s lag base (an offset) and lag (records) at ``now_s``; return its lag
        seconds. A base lower than the last one (the partition was rewound) restarts its
        window."""
        part = self._partitions.setdefault(tp, _Partition())
        samples = part.samples
        if samples and base_offset < samples[-1][1]:
            samples.clear()
        samples.append((now_s, base_offset))
        # keep one sample at or before the window's start, so the rate spans the whole window
        while len(samples) > 2 and samples[1][0] <= now_s - self.window_s:
            samples.popleft()
        part.lag = max(0.0, lag)
        return self._seconds(part.lag, self._rate(part))

    def partition(self, tp: Hashable) -> float:
        """``tp``'s lag seconds as of its last :meth:`observe` (0 when never observed)."""
        part = self._partitions.get(tp)
        return 0.0 if part is None else self._seconds(part.lag, self._rate(part))

    def total(self) -> float:
        """The member's lag seconds: every partition's lag over the sum of their rates."""
        lag = sum(p.lag for p in self._partitions.values())
        rate = sum(self._rate(p) for p in self._partitions.values())
        return self._seconds(lag, rate)

    def forget(self, tp: Hashable) -> None:
        """Drop ``tp``'s window (it moved to another member)."""
        self._partitions.pop(tp, None)

    @staticmethod
    def _rate(part: _Partition) -> float:
        """Offsets answered per second over the window (0 with fewer than two samples)."""
        (t0, o0), (t1, o1) = part.samples[0], part.samples[-1]
        return (o1 - o0) / (t1 - t0) if t1 > t0 else 0.0

    def _seconds(self, lag: float, rate: float) -> float:
        if lag <= 0:
            return 0.0
        if rate <= 0:
            return self.cap_s
        return min(self.cap_s, lag / rate)
