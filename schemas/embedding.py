"""Embedding options and compact encodings of contract 1.1 (CONTRACT.md §Additions in 1.1).

Pure numpy, used by the server (pooled vector → the ``result`` a request asked for) and by
clients (bytes → vector):

- :func:`shape_embedding`: keep the first ``dimensions`` values, then L2-normalise when asked
  (sentence-transformers' ``truncate_dim`` followed by ``normalize_embeddings``);
- :func:`encode_embedding`: a list of floats (``float``), little-endian float32/float16 bytes
  (``f32le``/``f16le``) or packed sign bits (``binary``: 1 where the value is > 0, most
  significant bit first, ⌈dim/8⌉ bytes, trailing bits 0 — sentence-transformers'
  ``quantize_embeddings(..., precision="ubinary")`` for one vector);
- :func:`decode_embedding`: the inverse for clients.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import numpy.typing as npt

from schemas.models import ENCODING_FORMATS, EncodingFormat, embedding_bytes

__all__ = [
    "NORMALIZE_EPS",
    "decode_embedding",
    "embedding_result",
    "encode_embedding",
    "shape_embedding",
]

NORMALIZE_EPS: Final = 1e-12
"""Smallest norm divided by (``torch.nn.functional.normalize``'s ``eps``, as
sentence-transformers)."""

Vector = npt.NDArray[np.float32]


def shape_embedding(pooled: npt.ArrayLike, *, dimensions: int | None, normalize: bool) -> Vector:
    """``(dim,)`` float32: the first ``dimensions`` values of ``pooled`` (all when None),
    L2-normalised when ``normalize`` (a zero vector stays zero).

    Args:
        pooled: the model's pooled ``(H,)`` vector, not normalised.
        dimensions: how many leading values to keep (≤ H; checked by the caller).
        normalize: divide by the L2 norm of the kept values.
    """
    vector = np.asarray(pooled, dtype=np.float32)
    if dimensions is not None:
        vector = vector[:dimensions]
    if normalize:
        norm = float(np.linalg.norm(vector))
        vector = vector / np.float32(max(norm, NORMALIZE_EPS))
    return vector


def _unknown(encoding_format: str) -> ValueError:
    return ValueError(f"encoding_format must be one of {ENCODING_FORMATS}, got {encoding_format!r}")


def encode_embedding(vector: npt.ArrayLike, encoding_format: EncodingFormat) -> list[float] | bytes:
    """``vector`` as ``result.embedding`` is sent in ``encoding_format`` (module docstring).

    Raises:
        ValueError: an unknown format.
    """
    if encoding_format == "float":
        return np.asarray(vector, dtype=np.float32).tolist()  # type: ignore[no-any-return]
    if encoding_format == "f32le":
        return np.asarray(vector, dtype="<f4").tobytes()
    if encoding_format == "f16le":
        return np.asarray(vector, dtype="<f2").tobytes()
    if encoding_format == "binary":
        return np.packbits(np.asarray(vector) > 0).tobytes()
    raise _unknown(encoding_format)


def embedding_result(
    pooled: npt.ArrayLike,
    *,
    dimensions: int | None,
    normalize: bool,
    encoding_format: EncodingFormat,
) -> dict[str, Any]:
    """The contract's ``result`` map ``{"embedding", "dim", "format"}`` for ``pooled`` under
    these options (:func:`shape_embedding` then :func:`encode_embedding`)."""
    vector = shape_embedding(pooled, dimensions=dimensions, normalize=normalize)
    return {
        "embedding": encode_embedding(vector, encoding_format),
        "dim": int(vector.shape[0]),
        "format": encoding_format,
    }


def decode_embedding(
    embedding: list[float] | bytes,
    encoding_format: str,
    dim: int,
    *,
    unpack_bits: bool = True,
) -> npt.NDArray[Any]:
    """``result.embedding`` back to a numpy vector (for clients).

    ``float``/``f32le`` → ``(dim,)`` float32; ``f16le`` → ``(dim,)`` float16; ``binary`` →
    ``(dim,)`` uint8 of 0/1 bits (``unpack_bits``, the default) or the ``(⌈dim/8⌉,)`` packed
    uint8 bytes as sent (``unpack_bits=False``, what vector stores with Hamming distance take).

    Raises:
        ValueError: an unknown format, or bytes whose length does not match ``dim``.
    """
    if encoding_format == "float":
        return np.asarray(embedding, dtype=np.float32)
    size = embedding_bytes(encoding_format, dim)
    if size is None:
        raise ValueError(
            f"encoding_format must be one of {ENCODING_FORMATS}, got {encoding_format!r}"
        )
    if not isinstance(embedding, bytes | bytearray) or len(embedding) != size:
        raise ValueError(f"a {encoding_format} embedding of dim {dim} is {size} bytes")
    if encoding_format == "f32le":
        return np.frombuffer(embedding, dtype="<f4").astype(np.float32)
    if encoding_format == "f16le":
        return np.frombuffer(embedding, dtype="<f2").astype(np.float16)
    packed = np.frombuffer(embedding, dtype=np.uint8)
    return np.unpackbits(packed, count=dim) if unpack_bits else packed.copy()
