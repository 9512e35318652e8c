"""Batch-formation settings: one frozen, validated object; units in every name.

Defaults are measured on the VADER mix (``producer_tools.corpus``) with the packaged MiniLM on a
2-core CPU: the bucket edges below give padding efficiency ≥ 0.96 with full batches (the goal
is ≥ 0.92), and 2048 padded tokens is where CPU throughput stops improving. A GPU wants a
larger ``max_batch_tokens`` (e.g. 16384); the engine's warm-up lowers a budget the device
cannot hold.
"""

from __future__ import annotations

import itertools
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_BUCKET_EDGES: tuple[int, ...] = (
    8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 32, 36, 40, 44, 48, 56, 64,
    72, 80, 96, 112, 128, 144, 160, 192, 224, 256, 320, 384, 448, 512,
)  # fmt: skip
"""Upper token-length bound of each bucket (special tokens included), ~10 % apart.

A bucket ``i`` holds lengths in ``(edges[i-1], edges[i]]``; edges at or above the model's
maximum length are replaced by that length (:meth:`BatchPolicyConfig.edges_for`).
"""


class BatchPolicyConfig(BaseModel):
    """How the :class:`~consumer.batching.policy.BucketBatcher` forms batches.

    A batch leaves its bucket when it reaches ``max_batch_size`` items, or its padded tokens
    (``padded_len × n``) would exceed ``max_batch_tokens`` with one more item, or the bucket's
    deadline passes (its oldest item's arrival + ``max_wait_ms``, never reset). Raises
    ``pydantic.ValidationError`` (a ``ValueError``) for out-of-range or inconsistent values,
    naming them.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_batch_size: int = Field(default=64, ge=1, le=4096, description="Items per batch, at most.")
    max_batch_tokens: int = Field(
        default=2048,
        ge=1,
        le=1 << 22,
        description="Padded tokens per batch (padded_len × n), at most; a GPU is filled "
        "better by a larger budget (~16384). Must hold one item of the model's maximum length.",
    )
    max_wait_ms: float = Field(
        default=10.0,
        ge=0.0,
        le=60_000.0,
        description="Milliseconds a bucket's oldest item may wait for company. 0 = no wait.",
    )
    bucket_edges: tuple[int, ...] = Field(
        default=DEFAULT_BUCKET_EDGES,
        min_length=1,
        description="Strictly increasing upper token-length bounds of the buckets.",
    )
    preferred_batch_sizes: tuple[int, ...] = Field(
        default=(),
        description="On a deadline flush, take the largest of these that fits (the rest "
        "waits for the next batch). Empty: take everything queued.",
    )
    adaptive_wait: bool = Field(
        default=True,
        description="Flush a bucket at once when its arrival rate cannot fill the batch "
        "before its deadline (sparse traffic: latency ≈ compute time).",
    )
    batch_overhead_tokens: int = Field(
        default=32,
        ge=0,
        le=1 << 22,
        description="The fixed cost of running one batch, in padded tokens' worth of compute "
        "(CPU MiniLM: ~8 ms ≈ 60 tokens). A deadline flush takes the items of neighbouring "
        "under-filled buckets into its batch while the padding this adds is smaller than "
        "the batch it saves. 0 = buckets never mix.",
    )
    target_p99_ms: float | None = Field(
        default=None,
        gt=0.0,
        le=600_000.0,
        description="Latency target of the device path (queue + forward), ms: once the batch "
        "cost model has measured the device, a batch holds at most the padded tokens that "
        "finish within half of it (an item may wait for one running batch, then ride the "
        "next). Trades throughput for tail latency; never below one item of the model's "
        "maximum length. Unset: batches as large as the other limits allow.",
    )
    rate_window_ms: float = Field(
        default=250.0,
        gt=0.0,
        le=600_000.0,
        description="Time constant of each bucket's exponentially decayed arrival rate.",
    )
    bulk_max_batch_ms: float | None = Field(
        default=None,
        gt=0.0,
        le=600_000.0,
        description="Lanes: a bulk batch holds at most the padded tokens that the "
        "batch cost model (its CPU prior until fitted) says finish within this many ms — the "
        "most a ready live batch waits behind bulk work; never below one item of the model's "
        "maximum length. Unset (the default): automatic. Until the device is measured (its "
        "first 8 batches) and whenever no live batch ran in the last 60 s, full batches; "
        "otherwise the longer of the live lane's mean batch time and 4x the fitted fixed cost "
        "per batch.",
    )
    bulk_min_share: float = Field(
        default=0.1,
        ge=0.0,
        le=0.9,
        description="Lanes: the share of device time the bulk lane gets while both lanes have "
        "due work, so bulk never starves (measured over lane_share_window_ms). 0 = bulk runs "
        "only when live leaves the device idle.",
    )
    lane_share_window_ms: float = Field(
        default=5_000.0,
        gt=0.0,
        le=3_600_000.0,
        description="Lanes: time constant of the exponentially decayed device time per lane "
        "that bulk_min_share is measured on.",
    )

    @model_validator(mode="after")
    def _check_batch_policy(self) -> Self:
        edges = self.bucket_edges
        if any(e < 1 for e in edges) or any(b <= a for a, b in itertools.pairwise(edges)):
            raise ValueError(f"bucket_edges must be positive and strictly increasing: {edges}")
        pref = self.preferred_batch_sizes
        if any(p < 1 or p > self.max_batch_size for p in pref):
            raise ValueError(
                f"preferred_batch_sizes {pref} must lie in [1, max_batch_size="
                f"{self.max_batch_size}]"
            )
        if any(b <= a for a, b in itertools.pairwise(pref)):
            raise ValueError(f"preferred_batch_sizes must be strictly increasing: {pref}")
        return self

    @property
    def max_wait_s(self) -> float:
        """``max_wait_ms`` in seconds (the clock's unit)."""
        return self.max_wait_ms / 1000.0

    @property
    def lane_share_window_s(self) -> float:
        """``lane_share_window_ms`` in seconds."""
        return self.lane_share_window_ms / 1000.0

    @property
    def rate_window_s(self) -> float:
        """``rate_window_ms`` in seconds."""
        return self.rate_window_ms / 1000.0

    def edges_for(self, max_length: int) -> tuple[int, ...]:
        """The bucket edges capped at the model's ``max_length`` (the last edge is it).

        Raises ``ValueError`` when ``max_length < 1`` or one item of ``max_length`` tokens
        does not fit ``max_batch_tokens``.
        """
        if max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        if max_length > self.max_batch_tokens:
            raise ValueError(
                f"max_batch_tokens={self.max_batch_tokens} cannot hold one item of the model's "
                f"max_length={max_length}"
            )
        return (*(e for e in self.bucket_edges if e < max_length), max_length)
