"""The model seam: :class:`ModelBackend` (what a model must do) and :class:`FakeBackend`, a
deterministic torch-free backend for tests and for ``--model noop``.

No torch here: the torch backend is :mod:`consumer.model.torch_backend`; the runner that the
engine calls (failure splitting, timing, counters) is :mod:`consumer.model.batch_runner`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any, Literal, Protocol

from consumer.batching.types import TokenizedItem
from consumer.model.errors import FakeOOMError

__all__ = [
    "AutocastName",
    "BackendName",
    "FakeBackend",
    "FakeOOMError",
    "ModelBackend",
    "Quantize",
    "Task",
]

Task = Literal["embed", "classify", "rerank", "sparse", "token-classify"]
"""What a model computes: ``embed`` (a vector), ``classify`` (labels and scores), or contract
1.2's ``rerank`` (a pair's relevance), ``sparse`` (SPLADE weights), ``token-classify``
(per-token labels): :mod:`consumer.model.task_backends`."""

AutocastName = Literal["bf16", "fp16"]
"""A CUDA autocast dtype (``--dtype bfloat16`` / ``float16``)."""

BackendName = Literal["torch", "onnx"]
"""What runs the network (``--backend``): torch eager, or ONNX Runtime on the CPU."""

Quantize = Literal["none", "int8"]
"""``--quantize``: ``none`` (the model's own precision) or ``int8`` (ORT dynamic int8)."""


class ModelBackend(Protocol):
    """A loaded model on one device.

    Attributes:
        task: ``embed`` or ``classify``.
        max_length: maximum tokens per item, special tokens included.
        prefetch: whether collation should run one batch ahead (true on CUDA).
        name / revision: the model's name and version for replies (revision may be None).
        embedding_dim: the pooled embedding's dimension (embed; None for classify).
        normalizes: whether ``embedding`` is L2-normalised (a sentence-transformers
            ``Normalize`` module); an embed result's ``pooled`` is the vector before it.
    """

    task: Task
    max_length: int
    prefetch: bool
    name: str
    revision: str | None
    embedding_dim: int | None
    normalizes: bool

    def prepare(self, items: Sequence[TokenizedItem], padded_len: int) -> object:
        """Collate ``items`` into ``(n, padded_len)`` int64 ids and mask on the device."""
        ...

    def forward(self, prepared: object) -> list[dict[str, Any]]:
        """Compute a prepared batch; the contract's ``result`` map per item, in order (embed:
        plus ``pooled``, the ``(embedding_dim,)`` float32 vector before normalisation)."""
        ...

    def warmup(self, batch_size: int, seq_len: int) -> None:
        """Run one dummy batch of that shape (raises an OOM error when it does not fit)."""
        ...

    def is_oom(self, exc: BaseException) -> bool:
        """Whether ``exc`` means the device ran out of memory."""
        ...

    def recover(self, exc: BaseException) -> None:
        """Clean up after a failed batch (e.g. release cached CUDA memory)."""
        ...


class FakeBackend:
    """A deterministic, torch-free :class:`ModelBackend` for tests.

    ``embed`` answers a 4-dim L2-normalised vector that depends only on the item's token ids
    (never on the batch), with its un-normalised ``pooled`` list; ``classify`` answers two
    labels. Failures are injectable:

    Args:
        task: ``embed`` or ``classify``.
        max_length: maximum tokens per item.
        oom_above_padded_tokens: raise :class:`FakeOOMError` for batches (and warm-ups) with
            more padded tokens than this.
        fail_item_ids: raise ``RuntimeError`` for any batch containing one of these item ids.
        gate: when set, ``forward`` blocks until the event is set (a hung batch).

    Attributes:
        calls: ``(batch_size, padded_len)`` of each forward call, in order.
        computed: item ids of each successful forward, flattened in order.
        warmups: shapes passed to :meth:`warmup`.
    """

    def __init__(
        self,
        task: Task = "embed",
        max_length: int = 64,
        *,
        oom_above_padded_tokens: float = math.inf,
        fail_item_ids: Sequence[int] = (),
        gate: threading.Event | None = None,
    ) -> None:
        self.task: Task = task
        self.max_length = max_length
        self.prefetch = False
        self.name = "fake"
        self.revision: str | None = None
        self.embedding_dim: int | None = 4 if task == "embed" else None
        self.normalizes = task == "embed"
        self.oom_above_padded_tokens = oom_above_padded_tokens
        self.fail_item_ids = set(fail_item_ids)
        self.gate = gate
        self.calls: list[tuple[int, int]] = []
        self.computed: list[int] = []
        self.warmups: list[tuple[int, int]] = []
        self.recovered = 0

    def prepare(self, items: Sequence[TokenizedItem], padded_len: int) -> object:
        """Check the shape (ids must fit ``padded_len``) and return ``(items, padded_len)``."""
        if any(t.n_tokens > padded_len for t in items):
            raise ValueError("an item is longer than padded_len")
        return (list(items), padded_len)

    def forward(self, prepared: object) -> list[dict[str, Any]]:
        """Answer a prepared batch; raises the injected failures."""
        if not isinstance(prepared, tuple):
            raise TypeError("forward() takes the result of prepare()")
        items: list[TokenizedItem] = prepared[0]
        padded_len: int = prepared[1]
        self.calls.append((len(items), padded_len))
        if self.gate is not None:
            self.gate.wait()
        if len(items) * padded_len > self.oom_above_padded_tokens:
            raise FakeOOMError("CUDA out of memory (fake)")
        if any(t.item.item_id in self.fail_item_ids for t in items):
            raise RuntimeError("injected failure")
        self.computed.extend(t.item.item_id for t in items)
        return [self._answer(t.input_ids) for t in items]

    def warmup(self, batch_size: int, seq_len: int) -> None:
        """Record the shape; raises :class:`FakeOOMError` above the OOM threshold."""
        self.warmups.append((batch_size, seq_len))
        if batch_size * seq_len > self.oom_above_padded_tokens:
            raise FakeOOMError("CUDA out of memory (fake warm-up)")

    def is_oom(self, exc: BaseException) -> bool:
        """True for :class:`FakeOOMError`."""
        return isinstance(exc, FakeOOMError)

    def recover(self, exc: BaseException) -> None:
        """Count recoveries."""
        self.recovered += 1

    def _answer(self, ids: Sequence[int]) -> dict[str, Any]:
        if self.task == "classify":
            p = (sum(ids) % 100) / 100.0
            return {"label": "pos" if p >= 0.5 else "neg", "score": max(p, 1 - p),
                    "scores": {"neg": 1 - p, "pos": p}}  # fmt: skip
        v = [float(len(ids)), float(sum(ids) % 97 + 1), float(ids[0] if ids else 1), 1.0]
        norm = math.sqrt(sum(x * x for x in v))
        return {"embedding": [x / norm for x in v], "dim": 4, "pooled": v}
