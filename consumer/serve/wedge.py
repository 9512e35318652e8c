"""A wedged engine stops ``kbatch serve``: ``/healthz`` fails, serve leaves its group and exits.

A batch running past ``--batch-timeout-s`` makes the engine unhealthy (``/readyz`` 503,
``kbatch_engine_healthy`` 0) until it returns; a model thread cannot be killed, and a batch that
never returns (a hung CUDA kernel, a dead device) would keep the process's partitions for good.
So once one batch has run :data:`WEDGED_AFTER_TIMEOUTS` × ``--batch-timeout-s`` (3 × 60 s by
default) the engine counts as wedged, for good (:class:`WedgeWatch`), and serve

- fails ``/healthz`` (503, ``"engine_wedged": true``): Kubernetes' liveness probe restarts the
  container, even when the exit below hangs;
- stops as on SIGTERM, but waits for nothing the model still owes: the replies already sent get
  a short drain (:data:`WEDGED_DRAIN_S`) to be acknowledged and committed, every other record
  stays uncommitted; the consumer leaves the group (a static member too), so the group moves
  its partitions to the other members at once and their next owner computes those records;
- exits :data:`EXIT_ENGINE_WEDGED` (4) without waiting for the model thread: a bare host's
  process manager (systemd ``Restart=on-failure``) restarts it, and ``serve --replicas N``'s
  supervisor restarts that replica. A SIGTERM's drain that ends with a batch running past the
  bound exits 4 the same way (instead of 0 or 3 and an exit that waits for the thread).

Both, because neither alone covers every host: no liveness probe runs without Kubernetes, and a
wedged process's exit may itself hang. The factor leaves a slow but live batch (a long input
on a loaded device, one over the timeout) room to finish before the process is given up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, Final

__all__ = [
    "EXIT_ENGINE_WEDGED",
    "WEDGED_AFTER_TIMEOUTS",
    "WEDGED_DRAIN_S",
    "WedgeWatch",
    "watch_engine",
]

log = logging.getLogger("kbatch")

WEDGED_AFTER_TIMEOUTS: Final = 3.0
"""One batch running this many ``--batch-timeout-s`` wedges the engine (README §Operations)."""

EXIT_ENGINE_WEDGED: Final = 4
"""``kbatch serve``'s exit status after a wedged engine stopped it (0 is a clean drain, 1 a
start-up failure, 3 a drain past its deadline)."""

WEDGED_DRAIN_S: Final = 3.0
"""Seconds of a wedged engine's drain: the acknowledgements of replies already sent and the
commit (the model's answers are not waited for)."""

CHECK_INTERVAL_S: Final = 1.0
"""Seconds between two checks of :func:`watch_engine`."""


class WedgeWatch:
    """Decides when the engine is wedged: the batch on the model has run at least
    ``factor × batch_timeout_s`` seconds. Latched: once wedged, wedged for good (the batch
    returning later does not make the process trustworthy again).

    Args:
        batch_timeout_s: ``--batch-timeout-s`` (seconds, > 0).
        running_s: seconds the batch on the model now has run, 0.0 when none
            (:meth:`consumer.batching.engine.Engine.running_batch_s`); called from the event
            loop and the HTTP thread.
        factor: :data:`WEDGED_AFTER_TIMEOUTS`.
    """

    def __init__(
        self,
        batch_timeout_s: float,
        running_s: Callable[[], float],
        factor: float = WEDGED_AFTER_TIMEOUTS,
    ) -> None:
        self.factor = factor
        self.bound_s = batch_timeout_s * factor
        self._running_s = running_s
        self.wedged_after_s: float | None = None  # how long the batch had run when decided

    @property
    def wedged(self) -> bool:
        """Whether :meth:`check` found the engine wedged (latched)."""
        return self.wedged_after_s is not None

    def check(self) -> bool:
        """Look at the running batch now; True once the engine is (or was) wedged."""
        if self.wedged_after_s is None:
            running_s = self._running_s()
            if running_s >= self.bound_s:
                self.wedged_after_s = running_s
        return self.wedged

    def liveness(self) -> tuple[bool, dict[str, Any]]:
        """``/healthz``'s engine part: (alive, detail)."""
        return not self.check(), {"engine_wedged": self.wedged}


async def watch_engine(
    stop: asyncio.Event, watch: WedgeWatch, interval_s: float = CHECK_INTERVAL_S
) -> None:
    """Set ``stop`` (serve's SIGTERM event) once ``watch`` finds the engine wedged, logging one
    ERROR line; return when ``stop`` is set either way. Checks every ``interval_s`` seconds."""
    while not stop.is_set():
        if watch.check():
            log.error(
                "engine wedged: one batch has run %.1f s (the bound: %g × --batch-timeout-s = "
                "%g s); /healthz fails, leaving the group (the partitions move) and exiting %d",
                watch.wedged_after_s or 0.0,
                watch.factor,
                watch.bound_s,
                EXIT_ENGINE_WEDGED,
            )
            stop.set()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
