"""Which lane's due batch takes the next free model slot: live first, bulk in the spare capacity.

Pure (no asyncio, no clock of its own: ``now`` is passed in, monotonic seconds). The engine keeps
one :class:`~consumer.batching.policy.BucketBatcher` per lane (items of different lanes never
share a batch, so each batch's device time is one lane's and the share ledger stays exact) and
asks :meth:`LaneScheduler.next_lane` before forming each batch; it reports each finished batch's
device time with :meth:`LaneScheduler.note_batch`.

Rules:

1. A due live batch goes first.
2. A due bulk batch starts only while the device is idle (nothing formed or running), so a live
   batch that becomes due meanwhile waits for at most that one bulk batch. The engine sizes bulk
   batches so one takes at most ``bulk_max_batch_ms`` (the fitted cost model,
   :class:`~consumer.batching.cost.BatchCostModel`). Unset, :meth:`LaneScheduler.bulk_cap_ms`
   chooses it from what was measured: while live work runs, the larger of the live lane's mean
   batch time (a live request then waits behind a bulk batch no longer than behind one of its
   own) and :data:`BULK_FIXED_COST_MULTIPLE` × the fixed cost per batch (so at most a quarter of
   a bulk batch is fixed cost); with no live batch in the last :data:`LIVE_RECENT_S`, no cap
   (full batches, as a backlog runs). Sparse live traffic (a request every few seconds) still
   counts as live work: each of those requests would otherwise wait behind a full bulk batch.
   On a prefetching device (CUDA) bulk gives up the one-ahead collation overlap: the bound on
   live latency matters more.
3. Minimum share: while the bulk lane's share of recent device time (each lane's time decayed
   with time constant ``lane_share_window_ms``) is below ``bulk_min_share``, a due bulk batch
   takes the next free slot even before a due live batch, so a saturating live stream cannot
   starve bulk; it gets about ``bulk_min_share`` of the device. Before any batch has run nothing
   is owed. ``bulk_min_share = 0``: bulk runs only in capacity live work leaves idle.

The ledger's decay scales both lanes alike, so the share changes only when a batch ends; the
engine re-asks then (every finished batch wakes its dispatcher).
"""

from __future__ import annotations

import math

from consumer.batching.types import Lane

__all__ = [
    "BULK_FIXED_COST_MULTIPLE",
    "LANES",
    "LIVE_BATCH_EWMA_WEIGHT",
    "LIVE_RECENT_S",
    "LaneScheduler",
]

LANES: tuple[Lane, ...] = ("live", "bulk")
"""Every lane, highest priority first."""

BULK_FIXED_COST_MULTIPLE = 4.0
"""Rule 2's floor of an automatic bulk cap, in multiples of the fitted fixed cost per batch: a
bulk batch at least this long spends at most 1/4 of its time on the fixed cost (a CPU's
~17-20 ms for MiniLM here: ≥ ~70 ms batches; a GPU's ~1 ms: a few ms)."""

LIVE_RECENT_S = 60.0
"""Rule 2: how long after the last live batch the automatic bulk cap still holds, seconds."""

LIVE_BATCH_EWMA_WEIGHT = 1.0 / 16.0
"""Weight of the newest live batch in the live lane's mean batch time (about the last 16)."""


class LaneScheduler:
    """Decides which lane's due batch runs next; keeps each lane's decayed device time.

    Args:
        bulk_min_share: the bulk lane's minimum share of device time, in ``[0, 1)``.
        share_window_s: time constant of the decayed device time per lane, seconds > 0.

    Raises:
        ValueError: a share outside ``[0, 1)`` or a window ≤ 0.
    """

    def __init__(self, bulk_min_share: float, share_window_s: float) -> None:
        if not 0.0 <= bulk_min_share < 1.0 or not share_window_s > 0.0:
            raise ValueError(
                f"need 0 <= bulk_min_share < 1 and share_window_s > 0, got "
                f"{bulk_min_share}, {share_window_s}"
            )
        self.bulk_min_share = bulk_min_share
        self.share_window_s = share_window_s
        self._busy_ms: dict[Lane, float] = dict.fromkeys(LANES, 0.0)
        self._t = -math.inf  # when the ledger was last decayed
        self._live_batch_ms: float | None = None  # EWMA of live batches' device time
        self._live_t = -math.inf  # when the last live batch ended

    def note_batch(self, lane: Lane, device_ms: float, now: float) -> None:
        """A batch of ``lane`` held the device for ``device_ms`` milliseconds, ending at
        ``now`` (monotonic seconds). Negative or non-finite times are ignored."""
        if not math.isfinite(device_ms) or device_ms < 0.0:
            return
        if self._t != -math.inf:
            decay = math.exp(-max(0.0, now - self._t) / self.share_window_s)
            for k in LANES:
                self._busy_ms[k] *= decay
        self._t = max(now, self._t)
        self._busy_ms[lane] += device_ms
        if lane == "live":
            self._live_t = max(now, self._live_t)
            prev = self._live_batch_ms
            w = LIVE_BATCH_EWMA_WEIGHT
            self._live_batch_ms = device_ms if prev is None else prev + w * (device_ms - prev)

    def bulk_cap_ms(self, fixed_ms: float, now: float) -> float | None:
        """Rule 2's automatic bulk cap (``bulk_max_batch_ms`` unset), ms; None = no cap.

        Args:
            fixed_ms: the cost model's fitted fixed cost of one batch, ms ≥ 0.
            now: monotonic seconds.

        Returns:
            While a live batch ended within the last :data:`LIVE_RECENT_S`:
            ``max(BULK_FIXED_COST_MULTIPLE × fixed_ms, the live lane's mean batch ms)`` (an
            EWMA over about the last 16 live batches). Otherwise None:
            nothing live to protect, bulk runs full batches.
        """
        if self._live_batch_ms is None or now - self._live_t > LIVE_RECENT_S:
            return None
        return max(BULK_FIXED_COST_MULTIPLE * max(fixed_ms, 0.0), self._live_batch_ms)

    def bulk_share(self) -> float:
        """The bulk lane's share of the decayed device time, in ``[0, 1]`` (1.0 before any
        batch: nothing is owed)."""
        total = self._busy_ms["live"] + self._busy_ms["bulk"]
        return self._busy_ms["bulk"] / total if total > 0.0 else 1.0

    def bulk_owed(self) -> bool:
        """True while bulk's share is below ``bulk_min_share`` (rule 3)."""
        return self.bulk_share() < self.bulk_min_share

    def bulk_may_start(self, in_pipeline: int) -> bool:
        """Whether a due bulk batch may take a free slot now: the device is idle
        (``in_pipeline`` batches formed and not finished is 0; rule 2) or bulk is owed its
        share (rule 3)."""
        return in_pipeline == 0 or self.bulk_owed()

    def next_lane(
        self, *, live_due: bool, bulk_due: bool, free_slots: int, in_pipeline: int
    ) -> Lane | None:
        """The lane whose due batch takes the next model slot, or None (nothing may start).

        Args:
            live_due / bulk_due: whether that lane's batcher has a due batch now.
            free_slots: model slots free (the engine's depth minus ``in_pipeline``).
            in_pipeline: batches formed and not finished (running or being prepared).
        """
        if free_slots <= 0:
            return None
        if bulk_due and self.bulk_owed():
            return "bulk"
        if live_due:
            return "live"
        if bulk_due and in_pipeline == 0:
            return "bulk"
        return None
