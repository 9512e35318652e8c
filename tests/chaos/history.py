"""A history of one chaos run and its verdict, by Jepsen's names (pure: no Kafka, no clock).

What is recorded (each request has a unique key):

- every **acknowledged request**: :meth:`History.acked` with the monotonic time of its
  ``acks=all`` acknowledgement (an unacknowledged send may or may not be in the log: it is
  never counted as lost);
- every **reply seen live** by a client reading the reply topic during the run
  (``read_committed`` under ``--exactly-once``): :meth:`History.seen` with its partition,
  offset and time;
- after the run, the **final read** of the reply topic: :meth:`History.final` with every
  committed reply record, and the records that only a ``read_uncommitted`` reader sees (those
  of aborted transactions: :meth:`History.aborted`).

The verdict (:meth:`History.check`, a :class:`Verdict`):

==============  ==================================================================================
lost            acknowledged requests with no reply in the final read
duplicate       requests with more than one reply record in the final read (the contract lets a
                client drop repeats by key; this counts what reached it)
G1a             replies the live ``read_committed`` client saw that belong to an aborted
                transaction (Adya's *aborted read*)
unseen          acknowledged requests answered in the final read that the live client never saw
                (a reader that stopped early, or a reply that became visible after the run)
latency         per key, first live reply minus acknowledgement: p50, p99, max in seconds
==============  ==================================================================================
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

ReplyAt = tuple[int, int]
"""Where a reply record is: (partition, offset) in the reply topic."""


@dataclass(frozen=True)
class Verdict:
    """The checked history; ``ok`` when nothing was lost, repeated beyond ``allowed_duplicates``
    or read from an aborted transaction."""

    acked: int
    lost: frozenset[bytes]
    duplicates: dict[bytes, int]
    g1a: frozenset[ReplyAt]
    unseen: frozenset[bytes]
    latency_p50_s: float
    latency_p99_s: float
    latency_max_s: float

    def summary(self) -> dict[str, float | int]:
        """The figures for a report table."""
        return {
            "acked": self.acked,
            "lost": len(self.lost),
            "duplicates": sum(n - 1 for n in self.duplicates.values()),
            "g1a": len(self.g1a),
            "unseen": len(self.unseen),
            "latency_p50_s": round(self.latency_p50_s, 3),
            "latency_p99_s": round(self.latency_p99_s, 3),
            "latency_max_s": round(self.latency_max_s, 3),
        }


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


@dataclass
class History:
    """Everything one run acknowledged and saw (module docstring). Not thread-safe: record from
    one thread, or under the caller's lock."""

    acked_at: dict[bytes, float] = field(default_factory=dict)
    first_seen_at: dict[bytes, float] = field(default_factory=dict)
    seen_at: set[ReplyAt] = field(default_factory=set)
    final_replies: dict[bytes, set[ReplyAt]] = field(default_factory=dict)
    aborted_at: set[ReplyAt] = field(default_factory=set)

    def acked(self, key: bytes, at_s: float) -> None:
        """Request ``key`` was acknowledged (``acks=all``) at monotonic ``at_s``."""
        self.acked_at[key] = at_s

    def seen(self, key: bytes, partition: int, offset: int, at_s: float) -> None:
        """The live client read a reply to ``key`` at ``partition``/``offset`` at ``at_s``."""
        self.first_seen_at.setdefault(key, at_s)
        self.seen_at.add((partition, offset))

    def final(self, replies: Iterable[tuple[bytes, int, int]]) -> None:
        """The final ``read_committed`` read: (key, partition, offset) of every reply record."""
        for key, partition, offset in replies:
            self.final_replies.setdefault(key, set()).add((partition, offset))

    def aborted(self, places: Iterable[ReplyAt]) -> None:
        """Reply records of aborted transactions (in ``read_uncommitted``, not in the final
        ``read_committed`` read)."""
        self.aborted_at.update(places)

    def check(self) -> Verdict:
        """The verdict (module docstring)."""
        acked = set(self.acked_at)
        latencies = [
            self.first_seen_at[k] - self.acked_at[k] for k in acked if k in self.first_seen_at
        ]
        return Verdict(
            acked=len(acked),
            lost=frozenset(k for k in acked if k not in self.final_replies),
            duplicates={k: len(v) for k, v in self.final_replies.items() if len(v) > 1},
            g1a=frozenset(self.seen_at & self.aborted_at),
            unseen=frozenset(
                k for k in acked if k in self.final_replies and k not in self.first_seen_at
            ),
            latency_p50_s=quantile(latencies, 0.5),
            latency_p99_s=quantile(latencies, 0.99),
            latency_max_s=max(latencies, default=math.nan),
        )
