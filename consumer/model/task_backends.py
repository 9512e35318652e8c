"""The torch backends of contract 1.2's tasks: ``rerank``, ``sparse``, ``token-classify``.

Each is a :class:`~consumer.model.torch_backend.TorchBackend` (padding, device copies,
autocast, warm-up, out-of-memory handling are shared) with its own head and result:

- ``rerank``: a cross-encoder, ``AutoModelForSequenceClassification`` with one label, fed
  (query, document) pairs with their segment ids; a pair's result is ``{"score": float}``, the
  logit through the model's activation as sentence-transformers' ``CrossEncoder.predict``
  applies it (Sigmoid or Identity, found where sentence-transformers finds it:
  :mod:`consumer.model.cross_encoder`). :class:`consumer.batching.fanout.FanOutEngine` gathers
  a request's pairs.
- ``sparse``: a SPLADE encoder, ``AutoModelForMaskedLM``; weights
  ``pool_L(log(1 + relu(logits)) · mask)`` over the sequence (``max``, or ``sum``; a second
  ``log1p`` for ``log1p_relu``), as sentence-transformers' ``SpladePooling`` (read from
  ``modules.json``; absent: max, relu). The result holds the non-zero weights under
  :data:`schemas.sparse.SPARSE` (``(indices int64 ascending, values float32)``) and ``dim``
  (the vocabulary size); replies shape ``top_k`` and the encoding.
- ``token-classify``: ``AutoModelForTokenClassification``; softmax per token (float32). The
  result holds a :class:`consumer.entities.TokenScores` under :data:`consumer.entities.TOKENS`
  (the item's text, scores, the tokenizer's alignment); replies group entities per request.

Every forward is masked, so padding and batch neighbours never change a result.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from consumer.batching.types import TokenAlignment, TokenizedItem
from consumer.entities import TOKENS, TokenScores
from consumer.model.cross_encoder import Activation
from consumer.model.errors import map_device_errors
from consumer.model.torch_backend import TorchBackend, _Prepared
from schemas.sparse import SPARSE

__all__ = ["RerankBackend", "SparseBackend", "SpladeConfig", "TokenClassifyBackend", "read_splade"]


@dataclass(frozen=True, slots=True)
class SpladeConfig:
    """sentence-transformers' ``SpladePooling`` settings."""

    pooling: Literal["max", "sum"] = "max"
    activation: Literal["relu", "log1p_relu"] = "relu"


def read_splade(model_dir: Path) -> SpladeConfig:
    """The ``SpladePooling`` module's config of a ``SparseEncoder`` directory
    (``modules.json``); absent: max pooling, relu.

    Raises:
        ValueError: a pooling or activation ``SpladePooling`` does not define.
    """
    modules_path = model_dir / "modules.json"
    if not modules_path.is_file():
        return SpladeConfig()
    for m in json.loads(modules_path.read_text()):
        if not str(m.get("type", "")).endswith("SpladePooling"):
            continue
        cfg_path = model_dir / str(m.get("path", "")) / "config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        pooling = cfg.get("pooling_strategy", "max")
        activation = cfg.get("activation_function", "relu")
        if pooling not in ("max", "sum") or activation not in ("relu", "log1p_relu"):
            raise ValueError(f"{model_dir}: SpladePooling {pooling}/{activation} unknown")
        return SpladeConfig(pooling, activation)
    return SpladeConfig()


@dataclass(slots=True)
class _TaskPrepared(_Prepared):
    type_ids: torch.Tensor | None = None  # (n, padded_len) int64, pair items only
    texts: list[str] | None = None  # token-classify
    alignments: list[TokenAlignment | None] | None = None
    lengths: list[int] | None = None


class _TaskBackend(TorchBackend):
    """Collation with segment ids (pairs) and alignments (token-classify)."""

    def prepare(self, items: Sequence[TokenizedItem], padded_len: int) -> _TaskPrepared:
        """:meth:`TorchBackend.prepare` plus ``(n, padded_len)`` segment ids when an item has
        them, and each item's text, alignment and length."""
        base = super().prepare(items, padded_len)
        type_ids = None
        if any(t.type_ids is not None for t in items):
            segments = np.zeros((len(items), padded_len), dtype=np.int64)
            for i, t in enumerate(items):
                if t.type_ids is not None:
                    segments[i, : t.n_tokens] = t.type_ids
            type_ids = self._to_device(segments)
        return _TaskPrepared(
            base.ids,
            base.mask,
            type_ids,
            [t.item.text for t in items],
            [t.alignment for t in items],
            [t.n_tokens for t in items],
        )

    @contextmanager
    def _running(self, prepared: object) -> Iterator[tuple[_TaskPrepared, Any]]:
        """The model's output for ``prepared`` (a warm-up batch included), inside the device
        error mapping, inference mode and autocast that the caller's post-processing needs too.

        Raises:
            TypeError: ``prepared`` is not what :meth:`prepare` returns.
        """
        numel = int(prepared.ids.numel()) if isinstance(prepared, _Prepared) else 0
        with map_device_errors(), torch.inference_mode(), self._autocast(numel):
            yield self._run(prepared)

    def _run(self, prepared: object) -> tuple[_TaskPrepared, Any]:
        if not isinstance(prepared, _Prepared):
            raise TypeError("forward() takes the result of prepare()")
        if not isinstance(prepared, _TaskPrepared):  # a warm-up batch
            prepared = _TaskPrepared(prepared.ids, prepared.mask)
        kwargs: dict[str, torch.Tensor] = {
            "input_ids": prepared.ids,
            "attention_mask": prepared.mask,
        }
        if prepared.type_ids is not None:
            kwargs["token_type_ids"] = prepared.type_ids
        return prepared, self.model(**kwargs)


class RerankBackend(_TaskBackend):
    """A cross-encoder (see the module docstring).

    Args:
        activation: what ``CrossEncoder.predict`` applies to the logit
            (:func:`consumer.model.cross_encoder.read_activation`); the rest as
            :class:`TorchBackend` with task ``classify``.

    Raises:
        ValueError: the model has more than one label (a rerank score is one number).
    """

    def __init__(self, model: torch.nn.Module, *, activation: Activation, **kwargs: Any) -> None:
        super().__init__(model, "classify", **kwargs)
        self.task = "rerank"
        if len(self.labels) != 1:
            raise ValueError(
                f"a rerank model has one output (a relevance logit); this one has "
                f"{len(self.labels)} labels"
            )
        self.activation = activation

    def forward(self, prepared: object) -> list[dict[str, Any]]:
        """``{"score": float}`` per pair, in order."""
        with self._running(prepared) as (_, out):
            logits = out.logits.float()[:, 0]
            scores = torch.sigmoid(logits) if self.activation == "sigmoid" else logits
            return [{"score": s} for s in scores.cpu().tolist()]


class SparseBackend(_TaskBackend):
    """A SPLADE encoder (see the module docstring).

    Args:
        splade: the pooling (:func:`read_splade`); the rest as :class:`TorchBackend`.
    """

    def __init__(self, model: torch.nn.Module, *, splade: SpladeConfig, **kwargs: Any) -> None:
        super().__init__(model, "embed", pooling=None, **kwargs)
        self.task = "sparse"
        self.splade = splade
        config = getattr(model, "config", None)
        self.vocab_size = int(getattr(config, "vocab_size", 0))
        self.embedding_dim = self.vocab_size
        self.normalizes = False

    def forward(self, prepared: object) -> list[dict[str, Any]]:
        """The non-zero weights of each row (``SPARSE``) and ``dim``."""
        with self._running(prepared) as (task_prepared, out):
            # (n, L, V) float32: the batch's largest tensor (30 522 floats a padded token for
            # a BERT vocabulary), so it is transformed in place, never copied.
            weights = out.logits.float()
            weights.mul_(task_prepared.mask.unsqueeze(-1).to(weights.dtype)).relu_().log1p_()
            if self.splade.activation == "log1p_relu":
                weights.log1p_()
            pooled = weights.max(dim=1).values if self.splade.pooling == "max" else weights.sum(1)
            rows = pooled.cpu().numpy()
        results: list[dict[str, Any]] = []
        for row in rows:
            (indices,) = np.nonzero(row)
            results.append(
                {
                    SPARSE: (indices.astype(np.int64), row[indices].astype(np.float32)),
                    "dim": self.vocab_size,
                }
            )
        return results


class TokenClassifyBackend(_TaskBackend):
    """A token classifier (see the module docstring); needs ``config.id2label``."""

    def __init__(self, model: torch.nn.Module, **kwargs: Any) -> None:
        super().__init__(model, "classify", **kwargs)
        self.task = "token-classify"

    def forward(self, prepared: object) -> list[dict[str, Any]]:
        """The item's per-token softmax scores and alignment (``TOKENS``)."""
        with self._running(prepared) as (task_prepared, out):
            probs = torch.softmax(out.logits.float(), dim=-1).cpu().numpy()
        texts = task_prepared.texts or [""] * len(probs)
        alignments = task_prepared.alignments or [None] * len(probs)
        lengths = task_prepared.lengths or [0] * len(probs)
        results: list[dict[str, Any]] = []
        for text, alignment, n, scores in zip(texts, alignments, lengths, probs, strict=True):
            if alignment is None:  # a warm-up row: no text behind it
                alignment = TokenAlignment([], [], [])
                n = 0
            results.append(
                {
                    TOKENS: TokenScores(
                        text,
                        scores[:n],
                        self.labels,
                        alignment.offsets,
                        alignment.special,
                        alignment.is_subword,
                    )
                }
            )
        return results
