"""Honest baselines: the model code a user writes without kbatch (plain transformers, no kbatch
import in this module), for ``kbatch bench engine`` and ``kbatch bench e2e``'s ``naive``.

- :class:`PlainModel`: ``AutoTokenizer`` + ``AutoModel``, mean pooling over the attention
  mask and L2 normalisation (what all-MiniLM-L6-v2's model card shows), under
  ``torch.inference_mode``; ``embed(texts)`` → ``(n, H)`` float32 numpy rows.
- :func:`plain_loop`: one text at a time (tokenize, forward, pool) — the ``plain_loop``
  reference of ``kbatch bench engine``.
- :func:`sorted_offline`: the whole backlog known in advance, sorted by token length and cut
  into batches greedily under the same padded-token budget and batch-size cap as the engine —
  the best an offline script can do with perfect knowledge (``sorted_offline``).

Both timings include tokenization, as the engine's backlog does. Torch threads are whatever
the caller set (``torch.set_num_threads``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoModel, AutoTokenizer

__all__ = ["BaselineRun", "PlainModel", "plain_loop", "sorted_offline"]


class PlainModel:
    """A sentence embedder as its model card writes it (see the module docstring).

    Args:
        model_dir: a ``save_pretrained`` directory.
        max_length: token cap (texts are truncated to it); default: the model's
            ``sentence_bert_config.json`` ``max_seq_length``, else the smaller of the
            tokenizer's and the position embeddings' maximum.
        threads: when given, ``torch.set_num_threads(threads)``.
        device: where the model runs (``cpu``, ``cuda``); on CUDA ``dtype`` (``bf16`` or
            ``fp16``) casts the weights, as a user would with ``torch_dtype``.
    """

    def __init__(
        self,
        model_dir: Path,
        max_length: int | None = None,
        threads: int | None = None,
        device: str = "cpu",
        dtype: str | None = None,
    ) -> None:
        if threads is not None:
            torch.set_num_threads(threads)
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.model = AutoModel.from_pretrained(str(model_dir)).eval().to(device)
        if dtype in ("bf16", "fp16") and device != "cpu":
            self.model.to(torch.bfloat16 if dtype == "bf16" else torch.float16)
        self.device = device
        sbert = Path(model_dir) / "sentence_bert_config.json"
        if max_length is None and sbert.is_file():
            max_length = json.loads(sbert.read_text()).get("max_seq_length")
        self.max_length = max_length or min(
            self.tokenizer.model_max_length, self.model.config.max_position_embeddings
        )

    def encode(self, texts: list[str]) -> Any:
        """The tokenizer's ``BatchEncoding`` of ``texts`` (int64 tensors, padded)."""
        return self.tokenizer(
            texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        )

    def lengths(self, texts: list[str]) -> list[int]:
        """Each text's token count (special tokens included, truncated to ``max_length``)."""
        ids = self.tokenizer(texts, truncation=True, max_length=self.max_length)["input_ids"]
        return [len(x) for x in ids]

    def embed(self, texts: list[str]) -> np.ndarray[Any, np.dtype[np.float32]]:
        """``(len(texts), H)`` L2-normalised mean-pooled embeddings, one padded batch."""
        enc = self.encode(texts).to(self.device)
        with torch.inference_mode():
            hidden = self.model(**enc).last_hidden_state.float()
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            out = torch.nn.functional.normalize(pooled, p=2, dim=1)
        result: np.ndarray[Any, np.dtype[np.float32]] = out.cpu().numpy()
        return result


@dataclass(frozen=True)
class BaselineRun:
    """One baseline's backlog: ``seconds`` wall time for ``texts`` texts, ``real_tokens`` and
    ``padded_tokens`` (special tokens included), ``batches`` and each batch's ``batch_ms``."""

    texts: int
    seconds: float
    real_tokens: int
    padded_tokens: int
    batches: int
    batch_ms: tuple[float, ...]


def plain_loop(model: PlainModel, texts: Sequence[str]) -> BaselineRun:
    """Embed ``texts`` one at a time (tokenize + forward + pool per text). The token count
    for ``real_tokens`` is taken before the clock starts."""
    real = sum(model.lengths(list(texts)))
    times: list[float] = []
    t0 = time.perf_counter()
    for text in texts:
        start = time.perf_counter()
        model.embed([text])
        times.append((time.perf_counter() - start) * 1000.0)
    seconds = time.perf_counter() - t0
    return BaselineRun(len(texts), seconds, real, real, len(texts), tuple(times))


def sorted_offline(
    model: PlainModel, texts: Sequence[str], *, max_batch_tokens: int, max_batch_size: int
) -> BaselineRun:
    """Embed ``texts`` sorted by token length, in greedy batches of at most ``max_batch_size``
    texts and ``max_batch_tokens`` padded tokens (rows × longest row)."""
    t0 = time.perf_counter()
    lengths = model.lengths(list(texts))
    order = sorted(range(len(texts)), key=lengths.__getitem__)
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:  # ascending: the new text is the longest of its batch
        if current and (
            len(current) + 1 > max_batch_size or (len(current) + 1) * lengths[i] > max_batch_tokens
        ):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    times: list[float] = []
    padded = 0
    for batch in batches:
        start = time.perf_counter()
        model.embed([texts[i] for i in batch])
        times.append((time.perf_counter() - start) * 1000.0)
        padded += len(batch) * max(lengths[i] for i in batch)
    seconds = time.perf_counter() - t0
    return BaselineRun(len(texts), seconds, sum(lengths), padded, len(batches), tuple(times))


def sentence_transformers_encode(
    model_dir: Path, texts: Sequence[str], batch_size: int = 32
) -> np.ndarray[Any, np.dtype[np.float32]]:
    """sentence-transformers' own ``SentenceTransformer(model_dir).encode(texts)`` on the CPU:
    ``(n, H)`` float32 rows, with every module of the model's ``modules.json`` applied (the
    reference ``kbatch bench quality`` compares embed backends against)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device="cpu")
    out = model.encode(list(texts), batch_size=batch_size, convert_to_numpy=True)
    result: np.ndarray[Any, np.dtype[np.float32]] = np.asarray(out, dtype=np.float32)
    return result
