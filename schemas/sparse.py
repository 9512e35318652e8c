"""Sparse embeddings on the wire (contract 1.2, task ``sparse``): the runner's non-zero
weights → the ``result`` a request asked for, and back (for clients).

Pure numpy. A result is ``{"indices", "values", "dim", "format"}``: the non-zero weights of a
``dim``-sized vector (the vocabulary), ``indices`` ascending. ``format`` is the request's
``encoding_format``: ``float`` (two lists), ``f32le`` / ``f16le`` (``indices`` as little-endian
uint32 bytes, ``values`` as little-endian float32 / float16 bytes: msgpack ``bin``, JSON
base64). ``top_k`` keeps the ``top_k`` largest weights (ties: the lower index), as
sentence-transformers' ``max_active_dims`` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import numpy as np
import numpy.typing as npt

__all__ = ["SPARSE", "decode_sparse", "sparse_result"]

SPARSE: Final = "sparse"
"""Key of the runner's sparse result holding ``(indices int64 ascending, values float32)`` of
the non-zero weights (not part of the contract; reply building turns it into the result)."""

_VALUE_DTYPES: Final = {"f32le": "<f4", "f16le": "<f2"}


def sparse_result(
    indices: npt.ArrayLike,
    values: npt.ArrayLike,
    *,
    dim: int,
    top_k: int | None = None,
    encoding_format: str = "float",
) -> dict[str, Any]:
    """The contract's sparse ``result`` map.

    Args:
        indices: ``(n,)`` int ascending, the non-zero weights' positions (< ``dim``).
        values: ``(n,)`` float, their weights.
        dim: the vector's size (the vocabulary).
        top_k: keep the ``top_k`` largest weights (None: all).
        encoding_format: ``float``, ``f32le`` or ``f16le``.

    Raises:
        ValueError: another ``encoding_format``.
    """
    idx = np.asarray(indices, dtype=np.int64)
    val = np.asarray(values, dtype=np.float32)
    if top_k is not None and top_k < len(idx):
        keep = np.lexsort((idx, -val))[:top_k]  # largest first, the lower index among ties
        keep.sort()
        idx, val = idx[keep], val[keep]
    if encoding_format == "float":
        return {"indices": idx.tolist(), "values": val.tolist(), "dim": dim, "format": "float"}
    dtype = _VALUE_DTYPES.get(encoding_format)
    if dtype is None:
        raise ValueError(f"a sparse result is float, f32le or f16le, not {encoding_format!r}")
    return {
        "indices": idx.astype("<u4").tobytes(),
        "values": val.astype(dtype).tobytes(),
        "dim": dim,
        "format": encoding_format,
    }


def decode_sparse(result: Mapping[str, Any]) -> tuple[npt.NDArray[np.int64], npt.NDArray[Any]]:
    """A sparse result (map or ``SparseResult.model_dump()``) back to ``(indices, values)``
    numpy arrays (for clients); float16 values stay float16."""
    fmt = result.get("format", "float")
    if fmt == "float":
        return (
            np.asarray(result["indices"], dtype=np.int64),
            np.asarray(result["values"], dtype=np.float32),
        )
    dtype = _VALUE_DTYPES[fmt]
    indices = np.frombuffer(result["indices"], dtype="<u4").astype(np.int64)
    return indices, np.frombuffer(result["values"], dtype=dtype)
