"""Chunked embeddings (contract 1.3, ``chunking``): the reply's ``result`` from the chunks'.

Pure numpy. The fan-out gathers a chunked item's outcome as ``{CHUNKS: ((result, n_tokens,
start, end), …)}`` (:func:`consumer.batching.fanout.gather_windows`): each chunk's runner
result (``embedding``, and ``pooled``, the full un-normalised vector), its tokens and its
character span. :func:`shape_chunks` makes the request's ``result`` from it, for its own
options, so dedup copies with another ``output``, ``dimensions``, ``normalize`` or format share
the computation:

- ``output: "pooled"``: the token-weighted mean of the chunks' vectors as the model returns
  them (each L2-normalised when the model normalises: what ``encode`` returns), weights each
  chunk's token count (special tokens and prompt included); then the embed options as for any
  vector (:func:`consumer.options.shape_result`): re-normalised when the model normalises (or
  ``normalize: true``), ``normalize: false`` the mean itself;
- ``output: "chunks"``: ``{"chunks": [{"embedding", "start", "end"}, …], "dim", "format"}``,
  each chunk's vector shaped by the options, as its own embed request's would be.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from consumer.batching.fanout import CHUNKS
from consumer.options import POOLED, EmbedOptions, ModelProfile, shape_result
from schemas.models import ChunkOutput

__all__ = ["CHUNKS", "shape_chunks"]


def _vector(result: Mapping[str, Any]) -> npt.NDArray[np.float64]:
    pooled = result.get(POOLED)
    return np.asarray(result["embedding"] if pooled is None else pooled, dtype=np.float64)


def shape_chunks(
    result: Mapping[str, Any],
    options: EmbedOptions,
    output: ChunkOutput,
    profile: ModelProfile,
) -> Mapping[str, Any]:
    """The contract ``result`` of a chunked embed request (see the module docstring).

    Args:
        result: the gathered ``{CHUNKS: ((runner result, n_tokens, start, end), …)}``.
        options: the request's embed options.
        output: ``pooled`` or ``chunks``.
        profile: the served model (``normalizes``).
    """
    chunks = result[CHUNKS]
    if output == "chunks":
        shaped = [
            (shape_result(dict(r), options, profile), start, end) for r, _, start, end in chunks
        ]
        first = shaped[0][0]
        return {
            "chunks": [
                {"embedding": s["embedding"], "start": start, "end": end}
                for s, start, end in shaped
            ],
            "dim": first["dim"],
            "format": first.get("format", "float"),
        }
    vectors = np.stack([_vector(r) for r, _, _, _ in chunks])
    if profile.normalizes:
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = vectors / np.where(norms > 0, norms, 1.0)
    weights = np.asarray([n for _, n, _, _ in chunks], dtype=np.float64)
    mean = (weights[:, None] * vectors).sum(axis=0) / weights.sum()
    embedding = mean
    if profile.normalizes:
        norm = float(np.linalg.norm(mean))
        embedding = mean / norm if norm > 0 else mean
    pooled = {
        "embedding": embedding.astype(np.float32).tolist(),
        "dim": int(mean.shape[0]),
        POOLED: mean.astype(np.float32),
    }
    return shape_result(pooled, options, profile)
