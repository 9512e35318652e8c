"""Backpressure decisions: which partitions to pause and resume.

Pure: no aiokafka, no I/O. The policy returns decisions, the consumer acts on them (calls
``consumer.pause`` / ``consumer.resume``) and keeps polling while paused, so it stays in the
group.

Rules:

* Limits on records and tokens buffered per partition and in total. Each limit is a high
  watermark; its low watermark is ``resume_fraction`` times it.
* A partition at or above either of its high watermarks is paused; a paused partition is
  resumed when both its counts are at or below their low watermarks (hysteresis, so a
  partition does not flap around one limit).
* When the total is at or above either total high watermark, every assigned partition is
  paused; they resume (unless paused on their own account) once both totals are at or below
  their low watermarks.
* aiokafka forgets pauses on every rebalance: after one, re-pause :meth:`FlowControl.reapply`.
* Lanes: a partition assigned with ``lane="bulk"`` (its records are bulk work)
  pauses first: when the totals reach ``bulk_total_fraction`` of the total limits (the bulk
  watermark, with the same hysteresis), while ``live`` partitions pause only at the hard limits
  above. A source outside this object's partitions — serve's backfill job runner, with its own
  consumer — counts what it buffers with :meth:`FlowControl.add_bulk` /
  :meth:`FlowControl.remove_bulk` (into the totals) and asks :meth:`FlowControl.should_pause_bulk`
  before each poll: True → pause all its partitions, False → resume them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from consumer.kafka.records import TopicPartition

Lane = Literal["live", "bulk"]
"""A partition's lane: the same values as ``consumer.batching.types.Lane`` (the Kafka layer
imports nothing of consumer outside it)."""


class FlowConfig(BaseModel):
    """The flow limits (high watermarks): records and tokens (special tokens included) buffered
    per partition and in total. ``kbatch serve`` exposes every field as a flag.

    Takes its fields by keyword or in declaration order (``FlowConfig(10, 100, 25, 250)``).

    Raises:
        pydantic.ValidationError (a ``ValueError``): a limit is below 1, or
            ``resume_fraction`` is outside ``[0, 1)``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_partition_records: int = Field(
        2_000, ge=1, description="Pause a partition at or above this many buffered records."
    )
    max_partition_tokens: int = Field(
        200_000, ge=1, description="Pause a partition at or above this many buffered tokens."
    )
    max_total_records: int = Field(
        10_000, ge=1, description="Pause every partition at or above this many in total."
    )
    max_total_tokens: int = Field(
        1_000_000, ge=1, description="Pause every partition at or above this many tokens in total."
    )
    resume_fraction: float = Field(
        0.5,
        ge=0.0,
        lt=1.0,
        description="Resume below this share of a limit (0: only when the buffer is empty).",
    )
    bulk_total_fraction: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="Pause bulk sources (backfill jobs, bulk partitions) when the totals reach "
        "this share of max_total_records/max_total_tokens; live ones pause only at the limits.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(**dict(zip(FlowConfig.model_fields, args, strict=False)), **kwargs)


@dataclass(frozen=True)
class FlowDecision:
    """Partitions to pause and to resume now; both empty when nothing changes."""

    pause: frozenset[TopicPartition]
    resume: frozenset[TopicPartition]

    def __bool__(self) -> bool:
        return bool(self.pause or self.resume)


class _Counts:
    __slots__ = ("lane", "over", "records", "tokens")

    def __init__(self, lane: Lane = "live") -> None:
        self.lane: Lane = lane
        self.records = 0
        self.tokens = 0
        self.over = False  # above its own high watermark, not yet back below the low one


class FlowControl:
    """Counts buffered records and tokens and decides pauses. See the module docstring."""

    def __init__(self, config: FlowConfig) -> None:
        self._config = config
        self._counts: dict[TopicPartition, _Counts] = {}
        self._total_records = 0
        self._total_tokens = 0
        self._total_over = False
        self._bulk_over = False  # totals at or above the bulk watermark (hysteresis)
        self._bulk = _Counts("bulk")  # buffered by sources outside the partitions (add_bulk)
        self._paused: set[TopicPartition] = set()

    @property
    def config(self) -> FlowConfig:
        return self._config

    @property
    def paused(self) -> frozenset[TopicPartition]:
        """Partitions the policy holds paused (as of the last :meth:`decide`)."""
        return frozenset(self._paused)

    @property
    def assigned(self) -> frozenset[TopicPartition]:
        return frozenset(self._counts)

    @property
    def total_records(self) -> int:
        return self._total_records

    @property
    def total_tokens(self) -> int:
        return self._total_tokens

    def records(self, tp: TopicPartition) -> int:
        """Records buffered for ``tp`` (0 when not assigned)."""
        counts = self._counts.get(tp)
        return 0 if counts is None else counts.records

    def tokens(self, tp: TopicPartition) -> int:
        """Tokens buffered for ``tp`` (0 when not assigned)."""
        counts = self._counts.get(tp)
        return 0 if counts is None else counts.tokens

    def assign(self, tp: TopicPartition, lane: Lane = "live") -> None:
        """Start counting ``tp`` (empty, not paused); a ``bulk`` partition pauses at the bulk
        watermark. A no-op when already assigned."""
        self._counts.setdefault(tp, _Counts(lane))

    def add_bulk(self, records: int, tokens: int) -> None:
        """Count ``records`` and ``tokens`` a bulk source outside the partitions (serve's job
        runner) took into its buffer: they count toward the totals. Raises ``ValueError`` for
        a negative count."""
        _check_counts(records, tokens)
        self._count_in(self._bulk, records, tokens)

    def remove_bulk(self, records: int, tokens: int) -> None:
        """Count ``records`` and ``tokens`` leaving that bulk source's buffer (stops at zero).
        Raises ``ValueError`` for a negative count."""
        _check_counts(records, tokens)
        self._count_out(self._bulk, records, tokens)

    def should_pause_bulk(self) -> bool:
        """Whether bulk sources should be paused now: the totals reached the bulk watermark
        (``bulk_total_fraction`` of the total limits) and have not yet fallen to its low
        watermark. Updates the hysteresis state that :meth:`decide` also uses."""
        cfg = self._config
        self._bulk_over = _hysteresis(
            self._bulk_over,
            self._total_records,
            self._total_tokens,
            max(1, int(cfg.max_total_records * cfg.bulk_total_fraction)),
            max(1, int(cfg.max_total_tokens * cfg.bulk_total_fraction)),
            cfg.resume_fraction,
        )
        return self._bulk_over

    def revoke(self, tp: TopicPartition) -> None:
        """Forget ``tp``: its counts leave the totals and it leaves :attr:`paused`."""
        counts = self._counts.pop(tp, None)
        if counts is not None:
            self._total_records -= counts.records
            self._total_tokens -= counts.tokens
        self._paused.discard(tp)

    def add(self, tp: TopicPartition, records: int, tokens: int) -> None:
        """Count ``records`` and ``tokens`` taken into the buffer for ``tp``.

        Raises:
            KeyError: ``tp`` is not assigned.
            ValueError: a count is negative.
        """
        counts = self._counts.get(tp)
        if counts is None:
            raise KeyError(f"partition {tp} is not assigned")
        _check_counts(records, tokens)
        self._count_in(counts, records, tokens)

    def remove(self, tp: TopicPartition, records: int, tokens: int) -> None:
        """Count ``records`` and ``tokens`` leaving the buffer for ``tp``.

        A no-op when ``tp`` is not assigned (its records were forgotten at revoke). Counts
        stop at zero, so a late removal belonging to an earlier assignment of ``tp`` cannot
        drive them negative.

        Raises:
            ValueError: a count is negative.
        """
        _check_counts(records, tokens)
        counts = self._counts.get(tp)
        if counts is not None:
            self._count_out(counts, records, tokens)

    def _count_in(self, counts: _Counts, records: int, tokens: int) -> None:
        """Add checked counts to ``counts`` and to the totals."""
        counts.records += records
        counts.tokens += tokens
        self._total_records += records
        self._total_tokens += tokens

    def _count_out(self, counts: _Counts, records: int, tokens: int) -> None:
        """Take checked counts from ``counts`` and from the totals, stopping at zero."""
        records = min(records, counts.records)
        tokens = min(tokens, counts.tokens)
        counts.records -= records
        counts.tokens -= tokens
        self._total_records -= records
        self._total_tokens -= tokens

    def decide(self) -> FlowDecision:
        """Which partitions to pause and resume now; updates :attr:`paused` to match.

        The caller must apply the decision (pause first is not required: the sets are
        disjoint).
        """
        cfg = self._config
        self._total_over = _hysteresis(
            self._total_over,
            self._total_records,
            self._total_tokens,
            cfg.max_total_records,
            cfg.max_total_tokens,
            cfg.resume_fraction,
        )
        bulk_over = self.should_pause_bulk()
        wanted: set[TopicPartition] = set()
        for tp, counts in self._counts.items():
            counts.over = _hysteresis(
                counts.over,
                counts.records,
                counts.tokens,
                cfg.max_partition_records,
                cfg.max_partition_tokens,
                cfg.resume_fraction,
            )
            if counts.over or self._total_over or (bulk_over and counts.lane == "bulk"):
                wanted.add(tp)
        decision = FlowDecision(
            pause=frozenset(wanted - self._paused), resume=frozenset(self._paused - wanted)
        )
        self._paused = wanted
        return decision

    def reapply(self) -> frozenset[TopicPartition]:
        """Partitions to pause again after a rebalance (aiokafka forgets pauses on one).

        Call after the new assignment has been :meth:`assign`-ed; newly assigned partitions
        that must pause come out of the next :meth:`decide`.
        """
        return frozenset(self._paused)


def _hysteresis(
    over: bool, records: int, tokens: int, max_records: int, max_tokens: int, fraction: float
) -> bool:
    """Whether a buffer is over its limits, given whether it was over before."""
    if records >= max_records or tokens >= max_tokens:
        return True
    if records <= max_records * fraction and tokens <= max_tokens * fraction:
        return False
    return over


def _check_counts(records: int, tokens: int) -> None:
    if records < 0 or tokens < 0:
        raise ValueError(f"counts must be >= 0, got records={records} tokens={tokens}")
