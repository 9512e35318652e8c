"""The measured cost of one batch: ``batch_ms ≈ fixed_ms + per_token_us × padded_tokens / 1000``.

Pure (no clock, no asyncio, no torch). The engine feeds it the runner's timing of every batch
(:meth:`BatchCostModel.observe`); the batching policy asks it how long a batch of a given size
will hold the device (:meth:`BatchCostModel.predict_ms`) and what one more batch costs in
padded tokens' worth of compute (:attr:`BatchCostModel.overhead_tokens`).

The affine model is the field report's (a batch's time ≈ fixed cost + padded tokens) and the
one ``sim:FIXED_MS,US_PER_TOKEN`` simulates; on a 2-core CPU MiniLM costs ≈ 5-8 ms fixed and
≈ 120 µs per padded token (≈ 250 seq/s of ~32 tokens), the simulated H200 ``sim:1,0.445`` 1 ms
and 0.445 µs. The fit is an exponentially weighted least
squares line (recent batches count more: the device's speed drifts with what else runs on the
machine), with the configured prior until the observed sizes spread enough to tell slope from
intercept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["BatchCostModel"]

MIN_SPREAD_TOKENS = 64.0
"""Weighted standard deviation of the observed padded tokens below which the slope is not
fitted (the batches were all about one size): the prior's intercept is kept and the slope
fitted through it."""


@dataclass
class BatchCostModel:
    """An online fit of one batch's device time from its padded tokens.

    Args:
        prior_fixed_ms: the fixed cost assumed before the data say otherwise, ms ≥ 0.
        prior_per_token_us: the per-padded-token cost assumed before any batch, µs > 0.
        half_life_batches: after this many batches an observation weighs half as much.

    Raises:
        ValueError: a negative fixed cost, a per-token cost ≤ 0 or a half-life < 1.
    """

    prior_fixed_ms: float = 5.0
    prior_per_token_us: float = 120.0
    half_life_batches: float = 64.0

    def __post_init__(self) -> None:
        if not self.prior_fixed_ms >= 0 or not self.prior_per_token_us > 0:
            raise ValueError(
                f"need prior_fixed_ms >= 0 and prior_per_token_us > 0, got "
                f"{self.prior_fixed_ms}, {self.prior_per_token_us}"
            )
        if not self.half_life_batches >= 1:
            raise ValueError(f"half_life_batches must be >= 1, got {self.half_life_batches}")
        self._decay = 0.5 ** (1.0 / self.half_life_batches)
        self._w = self._x = self._y = self._xx = self._xy = 0.0
        self.batches = 0
        self.fixed_ms = self.prior_fixed_ms
        self.per_token_us = self.prior_per_token_us

    def observe(self, padded_tokens: int, batch_ms: float) -> None:
        """One batch of ``padded_tokens`` (batch size × padded length) took ``batch_ms``.

        Non-finite or negative times and empty batches are ignored.
        """
        if padded_tokens <= 0 or not math.isfinite(batch_ms) or batch_ms < 0:
            return
        d, x, y = self._decay, float(padded_tokens), batch_ms
        self._w = self._w * d + 1.0
        self._x = self._x * d + x
        self._y = self._y * d + y
        self._xx = self._xx * d + x * x
        self._xy = self._xy * d + x * y
        self.batches += 1
        self._refit()

    def _refit(self) -> None:
        w = self._w
        mx, my = self._x / w, self._y / w
        var = self._xx / w - mx * mx
        if var > MIN_SPREAD_TOKENS**2:
            slope = (self._xy / w - mx * my) / var
            fixed = my - slope * mx
            if slope > 0 and fixed >= 0:
                self.per_token_us, self.fixed_ms = slope * 1000.0, fixed
                return
        # Too little spread (or a fit outside the model): keep the prior's fixed cost (at
        # most the mean batch time) and fit the slope through it.
        fixed = min(self.prior_fixed_ms, my)
        slope = (my - fixed) / mx if mx > 0 else 0.0
        self.fixed_ms = fixed
        self.per_token_us = max(slope * 1000.0, 1e-6)

    def predict_ms(self, padded_tokens: int) -> float:
        """Milliseconds a batch of ``padded_tokens`` will take (0 tokens: 0 ms)."""
        if padded_tokens <= 0:
            return 0.0
        return self.fixed_ms + self.per_token_us * padded_tokens / 1000.0

    @property
    def overhead_tokens(self) -> int:
        """The fixed cost in padded tokens' worth of compute (what merging two batches
        saves), ``fixed_ms / per_token_us``."""
        return round(self.fixed_ms * 1000.0 / self.per_token_us)

    def tokens_within(self, budget_ms: float) -> int:
        """The most padded tokens one batch may hold to finish within ``budget_ms`` (0 when
        even the fixed cost does not fit)."""
        spare_ms = budget_ms - self.fixed_ms
        if spare_ms <= 0:
            return 0
        return math.floor(spare_ms * 1000.0 / self.per_token_us + 1e-9)  # fitted floats
