"""The two seams of the engine: a tokenizer and a batch runner (implemented in ``consumer.model``).

Kept here, torch-free, so the engine and its tests need no model: ``consumer.model.batch_runner``
has a fake backend, and any object with these members will do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from consumer.batching.types import Batch, InferenceItem, ItemRun, Rejected, TokenizedItem

__all__ = ["BatchRunner", "TokenizerLike"]


class TokenizerLike(Protocol):
    """Turns a chunk of items into token ids (called in a worker thread, one chunk per call)."""

    @property
    def max_length(self) -> int:
        """The model's maximum length in tokens, special tokens included."""
        ...

    def tokenize(self, items: Sequence[InferenceItem]) -> list[TokenizedItem | Rejected]:
        """One result per item, in order: a :class:`TokenizedItem` (possibly truncated) or a
        :class:`Rejected` (``input_too_long`` when the item may not be truncated)."""
        ...


class BatchRunner(Protocol):
    """Computes batches; every method but :meth:`is_oom` runs in the engine's worker threads.

    ``run`` must not raise for a model error: it answers the failing items with
    ``inference_failed`` (splitting the batch to isolate them) — the engine never stops.
    """

    @property
    def max_length(self) -> int:
        """The model's maximum length in tokens."""
        ...

    @property
    def prefetch(self) -> bool:
        """Whether the engine should form and :meth:`prepare` one batch ahead (CUDA: yes, so
        collation and the host→device copy overlap compute; CPU: no, the cores are busy and a
        later batch is a fuller one)."""
        ...

    def prepare(self, batch: Batch) -> object:
        """Collate ``batch`` (padded ``(n, padded_len)`` int64 ids and mask) and start its copy
        to the device; the result is passed back to :meth:`run`."""
        ...

    def run(self, batch: Batch, prepared: object | None = None) -> list[ItemRun]:
        """Compute ``batch``; one :class:`ItemRun` per item, aligned with ``batch.items``."""
        ...

    def warmup(self, batch_size: int, seq_len: int) -> None:
        """Run one dummy batch of shape ``(batch_size, seq_len)``; raises what the model
        raises (an out-of-memory error when the shape does not fit)."""
        ...

    def is_oom(self, exc: BaseException) -> bool:
        """Whether ``exc`` is an out-of-memory error of this runner's device."""
        ...
