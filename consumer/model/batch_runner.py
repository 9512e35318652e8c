"""The runner the engine calls: :class:`ModelRunner` runs batches on a
:class:`~consumer.model.protocol.ModelBackend` with failure splitting, timing and counters.

No torch here: the torch backend lives in :mod:`consumer.model.torch_backend`.

Failure handling: any exception of a batch — an out-of-memory error or
anything else — splits the batch in half and retries each half (re-collated to its own padded
length); a single item that still fails is answered ``inference_failed``. The runner never
raises for a model error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from consumer.batching.stats import NullStats, StatsSink
from consumer.batching.types import Batch, ItemRun, TokenizedItem
from consumer.model.protocol import ModelBackend, Task
from schemas.errors import ErrorCode

__all__ = ["ModelRunner"]

log = logging.getLogger(__name__)


class ModelRunner:
    """Runs batches on a :class:`ModelBackend` with failure splitting, timing and counters.

    Implements :class:`consumer.batching.protocols.BatchRunner`. One thread computes at a
    time (the engine's model thread); :meth:`prepare` may run concurrently in another.

    Args:
        backend: the model.
        stats: receives ``on_batch`` per computed (sub-)batch, ``on_split``, ``on_failed``.
        clock: a monotonic clock in seconds, for ``infer_ms``.
    """

    def __init__(
        self,
        backend: ModelBackend,
        stats: StatsSink | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.backend = backend
        self.stats: StatsSink = stats if stats is not None else NullStats()
        self._clock = clock

    @property
    def max_length(self) -> int:
        """The backend's maximum length in tokens."""
        return self.backend.max_length

    @property
    def prefetch(self) -> bool:
        """Whether the engine should prepare one batch ahead (the backend's choice)."""
        return self.backend.prefetch

    @property
    def task(self) -> Task:
        """``embed`` or ``classify``."""
        return self.backend.task

    def prepare(self, batch: Batch) -> object:
        """Collate ``batch`` ahead of :meth:`run` (see :meth:`ModelBackend.prepare`)."""
        return self.backend.prepare(batch.items, batch.padded_len)

    def run(self, batch: Batch, prepared: object | None = None) -> list[ItemRun]:
        """Compute ``batch``: one :class:`ItemRun` per item, aligned with ``batch.items``.

        Never raises for a model error: a failing batch is split in half and retried, down
        to single items, which are answered ``inference_failed``.
        """
        return self._run(list(batch.items), batch.padded_len, prepared)

    def warmup(self, batch_size: int, seq_len: int) -> None:
        """Run one dummy batch of ``(batch_size, seq_len)``; raises the backend's error."""
        self.backend.warmup(batch_size, seq_len)

    def is_oom(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the backend's out-of-memory error."""
        return self.backend.is_oom(exc)

    def _run(
        self, items: list[TokenizedItem], padded_len: int, prepared: object | None
    ) -> list[ItemRun]:
        start = self._clock()
        try:
            if prepared is None:
                prepared = self.backend.prepare(items, padded_len)
            results = self.backend.forward(prepared)
            if len(results) != len(items):
                raise RuntimeError(f"backend returned {len(results)} results for {len(items)}")
        except Exception as exc:  # any per-batch failure: split and retry
            prepared = None
            self.backend.recover(exc)
            kind = "out of memory" if self.backend.is_oom(exc) else type(exc).__name__
            if len(items) == 1:
                log.warning("inference failed for item %s: %s", items[0].item.item_id, kind)
                self.stats.on_failed(1)
                return [
                    ItemRun(
                        result=None,
                        error_code=ErrorCode.INFERENCE_FAILED,
                        error_message=f"the model failed on this input ({kind})",
                    )
                ]
            log.warning(
                "batch of %d × %d failed (%s): splitting in half", len(items), padded_len, kind
            )
            self.stats.on_split()
            half = len(items) // 2
            out: list[ItemRun] = []
            for part in (items[:half], items[half:]):
                out.extend(self._run(part, max(t.n_tokens for t in part), None))
            return out
        infer_ms = (self._clock() - start) * 1000.0
        real = sum(t.n_tokens for t in items)
        self.stats.on_batch(len(items), real, padded_len * len(items), infer_ms, items[0].item.lane)
        n = len(items)
        return [
            ItemRun(result=r, infer_ms=infer_ms, batch_size=n, padded_len=padded_len)
            for r in results
        ]
