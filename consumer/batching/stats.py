"""Counters of the batching engine and the model runner, for the metrics layer and benches.

:class:`StatsSink` is the seam: the engine and the runner call it; ``consumer.serve.metrics`` (or a
test) implements it. :class:`EngineStats` is the plain in-memory implementation (totals plus
bounded recent samples), also used by ``kbatch bench engine``.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from consumer.batching.types import Lane

__all__ = ["EngineStats", "StatsSink"]


class StatsSink(Protocol):
    """Receives the engine's events. Called from the event loop and from the runner thread:
    implementations must be thread-safe (prometheus-client metrics are). Each method does
    nothing unless overridden (:class:`NullStats` is the protocol itself)."""

    def on_batch(
        self,
        batch_size: int,
        real_tokens: int,
        padded_tokens: int,
        infer_ms: float,
        lane: Lane = "live",
    ) -> None:
        """One (sub-)batch computed: items, real and padded (``padded_len × n``) tokens, and
        its model time in milliseconds (collate + forward + results to host); ``lane``: its items'
        lane (a batch never mixes lanes)."""
        return None

    def on_queue_wait(self, queue_ms: float, lane: Lane = "live") -> None:
        """One item's wait from arrival to the start of its batch, in milliseconds, and its
        lane."""
        return None

    def on_expired(self, n: int) -> None:
        """``n`` items answered ``expired`` without compute."""
        return None

    def on_split(self) -> None:
        """A failed batch (OOM or any error) was split in half for a retry."""
        return None

    def on_failed(self, n: int) -> None:
        """``n`` items answered ``inference_failed`` (a single item still failing)."""
        return None

    def on_watchdog(self) -> None:
        """A batch overran the watchdog: the engine reports unhealthy until it returns."""
        return None


@dataclass
class EngineStats:
    """In-memory :class:`StatsSink`: totals and the last ``keep`` samples of each series.

    Attributes (totals): ``batches``, ``items``, ``real_tokens``, ``padded_tokens``,
    ``expired``, ``splits``, ``failed``, ``watchdog_trips``. Series (deques): ``batch_sizes``,
    ``infer_ms`` (per batch), ``queue_ms`` (per item).
    """

    keep: int = 100_000
    batches: int = 0
    items: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    expired: int = 0
    splits: int = 0
    failed: int = 0
    watchdog_trips: int = 0
    batch_sizes: deque[int] = field(init=False)
    infer_ms: deque[float] = field(init=False)
    queue_ms: deque[float] = field(init=False)
    _lock: threading.Lock = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.batch_sizes = deque(maxlen=self.keep)
        self.infer_ms = deque(maxlen=self.keep)
        self.queue_ms = deque(maxlen=self.keep)
        self._lock = threading.Lock()

    @property
    def padding_efficiency(self) -> float:
        """Real / padded tokens over every batch so far (1.0 before the first batch)."""
        return self.real_tokens / self.padded_tokens if self.padded_tokens else 1.0

    def on_batch(
        self,
        batch_size: int,
        real_tokens: int,
        padded_tokens: int,
        infer_ms: float,
        lane: Lane = "live",
    ) -> None:
        with self._lock:
            self.batches += 1
            self.items += batch_size
            self.real_tokens += real_tokens
            self.padded_tokens += padded_tokens
            self.batch_sizes.append(batch_size)
            self.infer_ms.append(infer_ms)

    def on_queue_wait(self, queue_ms: float, lane: Lane = "live") -> None:
        with self._lock:
            self.queue_ms.append(queue_ms)

    def on_expired(self, n: int) -> None:
        with self._lock:
            self.expired += n

    def on_split(self) -> None:
        with self._lock:
            self.splits += 1

    def on_failed(self, n: int) -> None:
        with self._lock:
            self.failed += n

    def on_watchdog(self) -> None:
        with self._lock:
            self.watchdog_trips += 1


class NullStats(StatsSink):
    """A :class:`StatsSink` that drops everything (the protocol's own no-op methods)."""
