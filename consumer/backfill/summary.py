"""What a backfill job did: :class:`BackfillSummary` (printed by
:func:`consumer.backfill.progress.render_summary`, ``--json``) and its per-partition rows."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["BackfillSummary", "PartitionSummary"]


@dataclass(frozen=True, slots=True)
class PartitionSummary:
    """One partition's part of the job (offsets half-open ``[range_start, end)``)."""

    partition: int
    range_start: int
    start: int
    end: int
    resumed_from: int | None
    records_read: int
    reached_end: bool


@dataclass(frozen=True, slots=True)
class BackfillSummary:
    """What a job did; ``complete`` is true only when every partition reached its end (its
    end offset committed, nothing unfinished)."""

    source_topic: str
    output_topic: str
    dlq_topic: str
    group_id: str
    complete: bool
    stopped: bool
    records_read: int
    ok: int
    error_replies: int
    dead_lettered: int
    undelivered: int
    elapsed_s: float
    records_per_s: float
    batches: int
    mean_batch_size: float
    padding_efficiency: float
    partitions: tuple[PartitionSummary, ...]
    skipped_completed: int = 0
    """Records read and skipped: an earlier run had written them (its commit's metadata)."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (``--json``)."""
        return asdict(self)
