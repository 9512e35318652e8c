"""``schemas.embedding``: the shaping and the compact encodings of contract 1.1, and their
inverse for clients."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from schemas.embedding import decode_embedding, embedding_result, encode_embedding, shape_embedding
from schemas.models import EmbedResult


def test_binary_packs_sign_bits_msb_first_with_zero_trailing_bits() -> None:
    vector = np.array([1.0, -1.0, 0.0, 2.0, 0.5, -0.1, 3.0, 1e-9, 7.0, 0.0], np.float32)
    # > 0: 1 0 0 1 1 0 1 1 | 1 0 (then six padding bits, 0)
    assert encode_embedding(vector, "binary") == bytes([0b10011011, 0b10000000])


def test_f32le_and_f16le_are_little_endian() -> None:
    vector = np.array([1.0, -2.0], np.float32)
    assert encode_embedding(vector, "f32le") == b"\x00\x00\x80\x3f\x00\x00\x00\xc0"
    assert encode_embedding(vector, "f16le") == b"\x00\x3c\x00\xc0"


def test_dimensions_are_cut_before_normalising() -> None:
    shaped = shape_embedding([3.0, 4.0, 12.0], dimensions=2, normalize=True)
    assert shaped.tolist() == pytest.approx([0.6, 0.8])
    assert shape_embedding([3.0, 4.0, 12.0], dimensions=2, normalize=False).tolist() == [3.0, 4.0]
    assert shape_embedding([0.0, 0.0], dimensions=None, normalize=True).tolist() == [0.0, 0.0]


def test_result_dim_counts_dimensions_not_bytes() -> None:
    result = embedding_result(
        np.ones(20, np.float32), dimensions=12, normalize=True, encoding_format="binary"
    )
    assert result["dim"] == 12 and len(result["embedding"]) == 2
    assert EmbedResult.model_validate(result).format == "binary"


def test_a_byte_count_that_does_not_match_dim_is_rejected() -> None:
    with pytest.raises(ValueError, match="f16le embedding of dim 3 is 6 bytes"):
        decode_embedding(b"\x00" * 4, "f16le", 3)
    with pytest.raises(ValueError):
        EmbedResult(embedding=b"\x00" * 4, dim=3, format="f16le")
    with pytest.raises(ValueError):
        EmbedResult(embedding=[1.0], dim=1, format="f32le")  # bytes formats carry bytes


@settings(max_examples=200, deadline=None, database=None)
@given(
    vector=arrays(np.float32, st.integers(1, 70), elements=st.floats(-1e4, 1e4, width=32)),
    fmt=st.sampled_from(["float", "f32le", "f16le", "binary"]),
)
def test_decode_inverts_encode(vector: np.ndarray, fmt: str) -> None:  # type: ignore[type-arg]
    data = encode_embedding(vector, fmt)  # type: ignore[arg-type]
    back = decode_embedding(data, fmt, len(vector))
    if fmt == "binary":
        assert back.tolist() == (vector > 0).astype(np.uint8).tolist()
        packed = decode_embedding(data, fmt, len(vector), unpack_bits=False)
        assert packed.tobytes() == data and len(data) == (len(vector) + 7) // 8
    elif fmt == "f16le":
        assert back.dtype == np.float16 and back.tolist() == vector.astype(np.float16).tolist()
    else:
        assert back.dtype == np.float32 and back.tolist() == vector.tolist()
