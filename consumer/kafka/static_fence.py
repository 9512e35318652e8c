"""Telling a fenced static member from a member whose session merely expired (pure).

With ``--group-instance-id`` (KIP-345) a second member joining under the same id takes the
first one's place. Kafka's Java client learns it from a ``FENCED_INSTANCE_ID`` error and stops;
aiokafka 0.14 heartbeats with request versions older than that error, so it only sees
``UNKNOWN_MEMBER_ID``, resets its member id and rejoins — which takes the place back from the
other member, which rejoins in turn: both flap, every heartbeat, for ever.

The one thing a member sees is that it *lost its membership* (its member id was reset before a
rejoin). That also happens once after a session expiry (a network cut longer than
``session.timeout.ms``), or after a commit refused for an old generation; twice within
:data:`FENCE_WINDOW_S` (30 s; the flapping repeats every heartbeat, 1-3 s) is a duplicate
id. The member that loses twice first — the older one, as in Kafka — stops; the other keeps
working (kbatch serve exits 1 with one error line: :class:`FencedInstanceError`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Final

FENCE_WINDOW_S: Final = 30.0
FENCE_LOSSES: Final = 2


@dataclass
class StaticFenceDetector:
    """Counts membership losses of a static member (monotonic seconds passed in).

    :meth:`lost` records one and says whether the member is fenced: ``losses`` of them within
    ``window_s``.
    """

    window_s: float = FENCE_WINDOW_S
    losses: int = FENCE_LOSSES
    _at: deque[float] = field(default_factory=deque)

    def lost(self, now_s: float) -> bool:
        self._at.append(now_s)
        while self._at and self._at[0] < now_s - self.window_s:
            self._at.popleft()
        return len(self._at) >= self.losses
