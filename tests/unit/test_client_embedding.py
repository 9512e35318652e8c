"""``ReplyEnvelope.embedding`` / ``to_json``: a vector whatever ``encoding_format`` carried it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from producer_tools.client import ReplyEnvelope, ReplyRecordMeta
from schemas.codec import Encoding
from schemas.embedding import encode_embedding
from schemas.errors import ErrorCode
from schemas.models import EmbedResult, ErrorInfo, ModelInfo, Reply, Timing, Usage

VECTOR = np.array([0.5, -0.25, 0.0, 1.0, -1.0, 0.125, 2.0, -3.0, 0.75], np.float32)


def envelope(reply: Reply) -> ReplyEnvelope:
    meta = ReplyRecordMeta("rep", 0, 1, 0, b"k", (), b"c", reply.status)
    return ReplyEnvelope(reply, meta, b"k", Encoding.MSGPACK, 1, 1, 0.0, 0.1)


def ok(fmt: str) -> Reply:
    result = EmbedResult(embedding=encode_embedding(VECTOR, fmt), dim=9, format=fmt)  # type: ignore[arg-type]
    timing = Timing(queue_ms=0, infer_ms=0, batch_size=1, padded_len=3)
    return Reply(status="ok", result=result, model=ModelInfo(name="m"), timing=timing,
                 usage=Usage(tokens=3))  # fmt: skip


@pytest.mark.parametrize(
    ("fmt", "dtype", "expected"),
    [
        ("float", np.float32, VECTOR),
        ("f32le", np.float32, VECTOR),
        ("f16le", np.float16, VECTOR.astype(np.float16)),
        ("binary", np.uint8, (VECTOR > 0).astype(np.uint8)),
    ],
)
def test_every_format_decodes_to_a_vector_and_prints_as_a_list(
    fmt: str,
    dtype: type,
    expected: np.ndarray,  # type: ignore[type-arg]
) -> None:
    env = envelope(ok(fmt))
    vector = env.embedding()
    assert vector is not None and vector.dtype == dtype
    assert vector.tolist() == expected.tolist()
    printed = json.loads(json.dumps(env.to_json()))["reply"]
    assert printed["result"] == {"embedding": expected.tolist(), "dim": 9, "format": fmt}
    assert printed["usage"] == {"tokens": 3}


def test_packed_bits_on_request_and_none_without_an_embedding() -> None:
    packed = envelope(ok("binary")).embedding(unpack_bits=False)
    assert packed is not None and packed.tobytes() == bytes([0b10010110, 0b10000000])
    error = Reply(status="error", error=ErrorInfo(code=ErrorCode.INVALID_OPTION, message="x"),
                  model=ModelInfo(name="m"))  # fmt: skip
    assert envelope(error).embedding() is None
    assert envelope(error).to_json()["reply"]["error"]["code"] == "invalid_option"
