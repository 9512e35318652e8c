"""One request record of ``kbatch serve`` between its poll and its reply's acknowledgement."""

from __future__ import annotations

from dataclasses import dataclass

from consumer.batching.types import Lane
from consumer.kafka.records import InRecord
from schemas.records import ParsedRequest

__all__ = ["Pending"]


@dataclass(slots=True, eq=False)
class Pending:
    """One request record between poll and broker acknowledgement."""

    record: InRecord
    generation: int
    parsed: ParsedRequest | None = None
    n_tokens: int = 0
    item_id: int | None = None
    dedup_of: int | None = None
    dedup_key: bytes = b""
    """The key its computation is shared under (:func:`consumer.options.dedup_key`)."""
    status: str = ""
    """Its reply's ``kbatch-status`` once built (the ``kbatch_replies_total`` label)."""
    lane: Lane = "live"
    """Its request's ``priority`` (contract 1.2), once admitted: the engine lane it rides."""
    trace: object | None = None
    """Its request span under ``--tracing`` (:mod:`consumer.tracing.requests`), else None."""
