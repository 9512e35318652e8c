"""Request and reply values: every value clause of CONTRACT.md, and hostile inputs.

Pure unit tests (no Kafka). Records (key, headers) are in test_schemas_records.py; property
tests in test_schemas_properties.py.
"""

from __future__ import annotations

import base64
import json
import math
import re
import struct
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from pydantic import ValidationError

from schemas.codec import (
    DEFAULT_MAX_META_BYTES,
    DEFAULT_MAX_TEXT_BYTES,
    FLOAT32_MAX,
    MAX_DEPTH,
    MAX_ITEMS,
    Encoding,
    decode_reply,
    decode_request,
    encode_reply,
    encode_reply_wire,
    encode_request,
    max_request_bytes,
)
from schemas.embedding import decode_embedding, encode_embedding
from schemas.errors import DEAD_LETTER_CODES, DecodeError, EncodeError, ErrorCode
from schemas.models import (
    CONTRACT_REVISION,
    ChunkedEmbedResult,
    ClassifyResult,
    EmbedResult,
    EncodingFormat,
    ErrorInfo,
    ModelInfo,
    Reply,
    Request,
    Timing,
    reply_wire,
    result_from_map,
)

MSGPACK, JSON = Encoding.MSGPACK, Encoding.JSON
BOTH = pytest.mark.parametrize("encoding", [MSGPACK, JSON], ids=["msgpack", "json"])
MIB = 1024 * 1024
MODEL = ModelInfo(name="sentence-transformers/all-MiniLM-L6-v2", revision="abc123")
TIMING = Timing(queue_ms=1.5, infer_ms=3.25, batch_size=8, padded_len=32)


def enc(obj: Any, encoding: Encoding) -> bytes:
    """Encode a raw map, bypassing the models (to send what a broken client would)."""
    if encoding is MSGPACK:
        return msgpack.packb(obj, use_bin_type=True)
    return json.dumps(obj, ensure_ascii=False).encode("utf-8")


def rejects(
    value: bytes,
    encoding: Encoding = MSGPACK,
    code: ErrorCode = ErrorCode.INVALID_REQUEST,
    **kw: Any,
) -> DecodeError:
    with pytest.raises(DecodeError) as info:
        decode_request(value, encoding, **kw)
    assert info.value.code is code, info.value.message
    assert info.value.message  # a person can read why
    return info.value


# --- content-type ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, MSGPACK),
        (b"application/msgpack", MSGPACK),
        (b"application/json", JSON),
        (b"Application/JSON; charset=utf-8", JSON),
        (b" application/msgpack ", MSGPACK),
    ],
)
def test_content_type_selects_encoding_msgpack_by_default(
    header: bytes | None, expected: Encoding
) -> None:
    assert Encoding.from_content_type(header) is expected


@pytest.mark.parametrize(
    "header", [b"text/plain", b"application/xml", b"", b"\xff\xfe\x00json", b"application/j\xc3"]
)
def test_unknown_or_non_utf8_content_type_is_invalid_request(header: bytes) -> None:
    with pytest.raises(DecodeError) as info:
        Encoding.from_content_type(header)
    assert info.value.code is ErrorCode.INVALID_REQUEST
    assert "content-type" in info.value.message


# --- request value: fields ------------------------------------------------------------------


@BOTH
def test_minimal_request_defaults(encoding: Encoding) -> None:
    request = decode_request(enc({"text": "hello"}, encoding), encoding)
    assert request == Request(text="hello")
    assert (request.task, request.deadline_ms, request.truncate, request.meta, request.v) == (
        None,
        None,
        None,
        None,
        1,
    )


@BOTH
def test_full_request_decodes_every_field(encoding: Encoding) -> None:
    raw = {
        "text": "héllo ✓ 🙂",
        "task": "classify",
        "deadline_ms": 1_717_000_000_000,
        "truncate": False,
        "meta": {"trace": "t-1", "n": [1, 2.5, None, True]},
        "v": 1,
        "dimensions": 8,
        "normalize": False,
        "prompt_name": "query",
        "encoding_format": "f16le",
        "documents": ["first document", "second"],
        "top_n": 1,
        "top_k": 16,
        "aggregation": "first",
        "redact": True,
        "chunking": {"max_tokens": 128, "overlap": 16, "output": "chunks"},
        "priority": "bulk",
    }
    request = decode_request(enc(raw, encoding), encoding)
    assert request.model_dump() == raw


@BOTH
@pytest.mark.parametrize("text", [" ", "\n\t  ", "\u3000"])
def test_whitespace_only_text_is_valid(encoding: Encoding, text: str) -> None:
    assert decode_request(enc({"text": text}, encoding), encoding).text == text


@BOTH
@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({}, "text"),
        ({"text": ""}, "text"),
        ({"text": None}, "text"),
        ({"txt": "typo"}, "text"),
    ],
    ids=["absent", "empty", "null", "misspelt"],
)
def test_missing_or_empty_text_is_invalid_request(
    encoding: Encoding, raw: dict[str, Any], field: str
) -> None:
    assert field in rejects(enc(raw, encoding), encoding).message


@BOTH
@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("text", 42),
        ("text", ["a"]),
        ("text", True),
        ("task", "summarize"),
        ("task", 1),
        ("task", "EMBED"),
        ("deadline_ms", True),  # bool is not int
        ("deadline_ms", False),
        ("deadline_ms", "1717000000000"),
        ("deadline_ms", 1717000000000.0),
        ("deadline_ms", -1),
        ("deadline_ms", 2**63),
        ("truncate", 1),
        ("truncate", "true"),
        ("meta", [1, 2]),
        ("meta", "x"),
        ("v", True),  # bool is not int, not version 1 either
        ("v", "1"),
        ("v", 1.0),
    ],
)
def test_field_of_wrong_type_is_invalid_request(encoding: Encoding, field: str, bad: Any) -> None:
    error = rejects(enc({"text": "x", field: bad}, encoding), encoding)
    assert field in error.message


def test_binary_text_is_invalid_request_in_msgpack() -> None:
    error = rejects(enc({"text": b"hello"}, MSGPACK))
    assert "text" in error.message and "binary" in error.message


@BOTH
@pytest.mark.parametrize("task", ["embed", "classify"])
def test_both_task_names_are_accepted(encoding: Encoding, task: str) -> None:
    assert decode_request(enc({"text": "x", "task": task}, encoding), encoding).task == task


@BOTH
@pytest.mark.parametrize("field", ["task", "deadline_ms", "truncate", "meta", "v"])
def test_null_optional_field_counts_as_absent(encoding: Encoding, field: str) -> None:
    assert decode_request(enc({"text": "x", field: None}, encoding), encoding) == Request(text="x")


@BOTH
def test_unknown_fields_are_ignored(encoding: Encoding) -> None:
    raw = {"text": "x", "urgency": 3, "future": {"nested": [1, 2]}, "task": "embed"}
    assert decode_request(enc(raw, encoding), encoding) == Request(text="x", task="embed")


@BOTH
@pytest.mark.parametrize("version", [0, 2, 99, -1, 2**40])
def test_unknown_version_is_unsupported_version(encoding: Encoding, version: int) -> None:
    error = rejects(
        enc({"text": "x", "v": version}, encoding), encoding, ErrorCode.UNSUPPORTED_VERSION
    )
    assert "version" in error.message


@BOTH
def test_unknown_version_wins_over_other_field_errors_and_keeps_meta(encoding: Encoding) -> None:
    raw = {"v": 2, "texts": ["a", "b"], "meta": {"id": 7}}  # a v2 shape: no text
    error = rejects(enc(raw, encoding), encoding, ErrorCode.UNSUPPORTED_VERSION)
    assert error.meta == {"id": 7}


@BOTH
def test_invalid_request_keeps_valid_meta_for_the_error_reply(encoding: Encoding) -> None:
    error = rejects(enc({"text": "", "meta": {"id": 7}}, encoding), encoding)
    assert error.meta == {"id": 7}


@BOTH
@pytest.mark.parametrize("value", [[1, 2], "text", 3, None, True])
def test_value_that_is_not_a_map_is_invalid_request(encoding: Encoding, value: Any) -> None:
    assert "map" in rejects(enc(value, encoding), encoding).message


@BOTH
def test_empty_value_is_invalid_request(encoding: Encoding) -> None:
    rejects(b"", encoding)


def test_string_and_binary_map_keys_only_in_msgpack() -> None:
    assert "key" in rejects(enc({"text": "x", 1: "int key"}, MSGPACK)).message
    # a binary key is simply not a known field name
    assert decode_request(enc({"text": "x", b"task": "nope"}, MSGPACK)) == Request(text="x")


# --- sizes ------------------------------------------------------------------------------------


@BOTH
def test_text_at_max_text_bytes_is_accepted_one_more_byte_is_not(encoding: Encoding) -> None:
    limit = 1000
    ok = decode_request(enc({"text": "a" * limit}, encoding), encoding, max_text_bytes=limit)
    assert len(ok.text) == limit
    error = rejects(enc({"text": "a" * (limit + 1)}, encoding), encoding, max_text_bytes=limit)
    assert "1001 bytes" in error.message


@BOTH
def test_text_limit_counts_utf8_bytes_not_characters(encoding: Encoding) -> None:
    text = "é" * 501  # 1002 bytes, 501 characters
    rejects(enc({"text": text}, encoding), encoding, max_text_bytes=1000)
    assert decode_request(enc({"text": text}, encoding), encoding, max_text_bytes=1002).text == text


@BOTH
def test_default_text_limit_is_512_kib(encoding: Encoding) -> None:
    assert DEFAULT_MAX_TEXT_BYTES == 512 * 1024
    text = "x" * DEFAULT_MAX_TEXT_BYTES
    assert decode_request(enc({"text": text}, encoding), encoding).text == text
    rejects(enc({"text": text + "x"}, encoding), encoding)


@BOTH
def test_text_of_1_mib_plus_1_byte_is_rejected(encoding: Encoding) -> None:
    value = enc({"text": "a" * (MIB + 1)}, encoding)
    rejects(value, encoding)  # default limit: rejected by the size check, before parsing
    rejects(value, encoding, max_text_bytes=MIB)  # 1 MiB limit: rejected by the text check
    exact = enc({"text": "a" * MIB}, encoding)
    assert len(decode_request(exact, encoding, max_text_bytes=MIB).text) == MIB


def test_oversized_value_is_rejected_before_parsing() -> None:
    limit = max_request_bytes(MSGPACK)
    # Not even msgpack: if it were parsed the error would be a different one.
    error = rejects(b"\xc1" * (limit + 1))
    assert f"at most {limit}" in error.message


def test_json_text_limit_allows_for_escapes() -> None:
    text = "\x01" * 1000  # 1000 bytes of UTF-8, 6000 bytes of JSON escapes
    value = json.dumps({"text": text}).encode()
    assert len(value) > 6000
    assert decode_request(value, JSON, max_text_bytes=1000).text == text


@BOTH
def test_meta_at_4_kib_in_the_requests_encoding_is_accepted_more_is_not(
    encoding: Encoding,
) -> None:
    assert DEFAULT_MAX_META_BYTES == 4096
    # {"p": "x…"}: msgpack overhead 1 + 2 + 3 = 6 bytes (str16 header); JSON {"p":"…"} 8 bytes.
    overhead = 6 if encoding is MSGPACK else 8
    fits = {"p": "x" * (4096 - overhead)}
    too_big = {"p": "x" * (4097 - overhead)}
    assert decode_request(enc({"text": "x", "meta": fits}, encoding), encoding).meta == fits
    error = rejects(enc({"text": "x", "meta": too_big}, encoding), encoding)
    assert "meta is 4097 bytes" in error.message


def test_meta_size_is_measured_in_the_requests_encoding() -> None:
    # 1000 small ints: 1 byte each in msgpack, 2+ bytes each in JSON ("0,").
    meta = {"ints": [7] * 1000}
    assert decode_request(enc({"text": "x", "meta": meta}, MSGPACK), MSGPACK, max_meta_bytes=1100)
    rejects(enc({"text": "x", "meta": meta}, JSON), JSON, max_meta_bytes=1100)


@BOTH
def test_meta_is_kept_verbatim(encoding: Encoding) -> None:
    meta: dict[str, Any] = {"z": 1, "a": [0.1, -0.0, 2**62, "ü"], "m": {"k": None}, "b": False}
    if encoding is MSGPACK:
        meta["bin"] = b"\x00\xff"
        meta["ext"] = msgpack.ExtType(42, b"abc")
    request = decode_request(enc({"text": "x", "meta": meta}, encoding), encoding)
    assert request.meta == meta
    assert list(request.meta) == list(meta)  # key order too


def test_meta_needs_string_keys() -> None:
    assert "meta" in rejects(enc({"text": "x", "meta": {b"k": 1}}, MSGPACK)).message


# --- hostile inputs ---------------------------------------------------------------------------


def _bounded(fn: Callable[[], object], *, max_seconds: float, max_alloc_bytes: int) -> None:
    """Run fn (which must raise DecodeError) and check it stayed small and fast."""
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(DecodeError) as info:
            fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.code is ErrorCode.INVALID_REQUEST
    assert time.perf_counter() - started < max_seconds
    assert peak < max_alloc_bytes, peak


@pytest.mark.parametrize(
    "header",
    [
        b"\xdb\xff\xff\xff\xff",  # str32 of 4 GiB - 1
        b"\xc6\xff\xff\xff\xff",  # bin32
        b"\xc9\xff\xff\xff\xff\x01",  # ext32
        b"\xdd\xff\xff\xff\xff",  # array32 of 4 G entries
        b"\xdf\xff\xff\xff\xff",  # map32
    ],
    ids=["str32", "bin32", "ext32", "array32", "map32"],
)
def test_msgpack_length_claiming_4_gib_allocates_nothing(header: bytes) -> None:
    value = b"\x82\xa4text\xa1x\xa4meta" + header + b"a" * 16
    _bounded(lambda: decode_request(value), max_seconds=0.5, max_alloc_bytes=64 * 1024)


def test_msgpack_top_level_str_claiming_4_gib() -> None:
    _bounded(
        lambda: decode_request(b"\xdb\xff\xff\xff\xff" + b"a" * 16),
        max_seconds=0.5,
        max_alloc_bytes=64 * 1024,
    )


@pytest.mark.parametrize(
    "value",
    [
        b"\x91" * 10_000 + b"\xc0",  # arrays
        b"\x81\xa1k" * 10_000 + b"\xc0",  # maps
        b"\x82\xa4text\xa1x\xa4meta" + b"\x81\xa1k" * 10_000 + b"\xc0",  # inside meta
        b"\xdc\x00\x01" * 10_000 + b"\xc0",  # array16
    ],
    ids=["arrays", "maps", "meta", "array16"],
)
def test_msgpack_10000_deep_nesting_is_rejected_without_recursion(value: bytes) -> None:
    _bounded(lambda: decode_request(value), max_seconds=0.5, max_alloc_bytes=1024 * 1024)


@pytest.mark.parametrize(
    "value",
    [
        b"[" * 10_000 + b"]" * 10_000,
        b'{"a":' * 10_000 + b"1" + b"}" * 10_000,
        b'{"text":"x","meta":{"k":' + b"[" * 10_000 + b"]" * 10_000 + b"}}",
        b"[" * 10_000,  # unterminated
    ],
    ids=["arrays", "objects", "meta", "unterminated"],
)
def test_json_10000_deep_nesting_is_rejected(value: bytes) -> None:
    _bounded(lambda: decode_request(value, JSON), max_seconds=1.0, max_alloc_bytes=16 * MIB)


def _nest(depth: int) -> Any:
    node: Any = "leaf"
    for _ in range(depth):
        node = [node]
    return node


@BOTH
def test_nesting_limit_is_exactly_max_depth(encoding: Encoding) -> None:
    # The top-level map is depth 1, meta depth 2, so meta may hold MAX_DEPTH - 2 more levels.
    deepest = {"text": "x", "meta": {"k": _nest(MAX_DEPTH - 2)}}
    assert decode_request(enc(deepest, encoding), encoding).meta == deepest["meta"]
    too_deep = {"text": "x", "meta": {"k": _nest(MAX_DEPTH - 1)}}
    assert "nested deeper" in rejects(enc(too_deep, encoding), encoding).message


@BOTH
def test_too_many_values_is_rejected(encoding: Encoding) -> None:
    raw = {"text": "x", "junk": [0] * MAX_ITEMS}
    assert "more than" in rejects(enc(raw, encoding), encoding).message


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400"])
@pytest.mark.parametrize("where", ["field", "meta", "unknown"])
def test_json_nan_and_infinity_are_rejected(literal: bytes, where: str) -> None:
    template = {
        "field": b'{"text":"x","deadline_ms":%s}',
        "meta": b'{"text":"x","meta":{"f":%s}}',
        "unknown": b'{"text":"x","other":[%s]}',
    }[where]
    error = rejects(template % literal, JSON)
    assert "NaN/Infinity" in error.message


def test_json_huge_integer_is_rejected() -> None:
    rejects(b'{"text":"x","other":' + b"9" * 5000 + b"}", JSON)


@pytest.mark.parametrize(
    "value",
    [
        b'{"text":"\xff\xfe"}',  # invalid UTF-8
        b'{"text":"\xed\xa0\x80"}',  # UTF-8-encoded surrogate
        '{"text":"x"}'.encode("utf-16"),  # UTF-16 with BOM: JSON here is UTF-8 only
        b'\xef\xbb\xbf{"text":"x"}',  # UTF-8 BOM
    ],
    ids=["invalid", "surrogate-bytes", "utf16", "bom"],
)
def test_json_that_is_not_utf8_is_rejected(value: bytes) -> None:
    rejects(value, JSON)


@pytest.mark.parametrize(
    "value",
    [
        b'{"text":"\\ud800"}',
        b'{"text":"x","meta":{"\\udfff":1}}',
        b'{"text":"x","meta":{"k":"\\ud800"}}',
    ],
    ids=["text", "meta-key", "meta-value"],
)
def test_json_lone_surrogate_escape_is_rejected(value: bytes) -> None:
    assert "surrogate" in rejects(value, JSON).message


def test_msgpack_invalid_utf8_string_is_rejected() -> None:
    value = b"\x81\xa4text\xa2\xff\xfe"
    assert "UTF-8" in rejects(value).message


@pytest.mark.parametrize(
    "value",
    [
        b"\x81\xa4text",  # truncated
        msgpack.packb({"text": "x"}) + b"\xc0",  # trailing bytes
        b"\xc1",  # never-used byte
        b"\x81\xa4text\xd6\xff\x00\x00",  # truncated timestamp
    ],
    ids=["truncated", "trailing", "0xc1", "truncated-ext"],
)
def test_malformed_msgpack_is_rejected(value: bytes) -> None:
    rejects(value)


@pytest.mark.parametrize(
    "value", [b'{"v": 1, "text": "hi"}', b'  [{"text": "hi"}]'], ids=["object", "array"]
)
def test_json_sent_without_content_type_says_which_header_is_missing(value: bytes) -> None:
    """The value is JSON; without the header it is read as msgpack (the default)."""
    with pytest.raises(DecodeError) as info:
        decode_request(value)
    assert info.value.code is ErrorCode.INVALID_REQUEST
    assert "not valid msgpack" in info.value.message
    assert "content-type: application/json" in info.value.message


@pytest.mark.parametrize("value", [b"hello world", b"{not json", b"[" * 20_000])
def test_plain_text_sent_as_a_request_says_a_request_is_a_map(value: bytes) -> None:
    with pytest.raises(DecodeError) as info:
        decode_request(value)
    assert "it reads as JSON" not in info.value.message
    assert 'it reads as plain text: a request is a map with a "text" field' in info.value.message


def test_bytes_that_are_neither_json_nor_text_get_no_hint() -> None:
    with pytest.raises(DecodeError) as info:
        decode_request(b"\x81\xa4text\xc1\x00")
    assert "it reads as" not in info.value.message


def test_msgpack_malformed_timestamp_ext_is_rejected() -> None:
    # ext type -1 (timestamp) with a 3-byte payload is not a valid timestamp.
    rejects(b"\x82\xa4text\xa1x\xa4meta\x81\xa1t\xc7\x03\xff\x00\x00\x00")


# --- replies ----------------------------------------------------------------------------------


def ok_embed(embedding: list[float], **kw: Any) -> Reply:
    return Reply(
        status="ok",
        result=EmbedResult(embedding=embedding, dim=len(embedding)),
        model=MODEL,
        timing=TIMING,
        **kw,
    )


def ok_classify(**kw: Any) -> Reply:
    return Reply(
        status="ok",
        result=ClassifyResult(
            label="POSITIVE", score=0.9, scores={"NEGATIVE": 0.1, "POSITIVE": 0.9}
        ),
        model=MODEL,
        timing=TIMING,
        **kw,
    )


def error_reply(code: ErrorCode = ErrorCode.INPUT_TOO_LONG, **kw: Any) -> Reply:
    kw.setdefault("model", MODEL)
    return Reply(status="error", error=ErrorInfo(code=code, message="why"), **kw)


def expired_reply(**kw: Any) -> Reply:
    info = ErrorInfo(code=ErrorCode.DEADLINE_EXCEEDED, message="deadline passed 12 ms ago")
    return Reply(status="expired", error=info, model=MODEL, **kw)


def wire(reply: Reply, encoding: Encoding) -> dict[str, Any]:
    value = encode_reply(reply, encoding)
    out = msgpack.unpackb(value) if encoding is MSGPACK else json.loads(value)
    assert isinstance(out, dict)
    return out


@BOTH
def test_ok_embed_reply_fields(encoding: Encoding) -> None:
    out = wire(ok_embed([0.6, 0.8], truncated=True, dedup=True, meta={"id": 1}), encoding)
    assert list(out) == ["v", "status", "result", "model", "truncated", "dedup", "meta", "timing"]
    assert out["v"] == 1 and out["status"] == "ok"
    assert out["result"]["dim"] == 2 and len(out["result"]["embedding"]) == 2
    assert out["result"]["format"] == "float"
    assert out["model"] == {"name": MODEL.name, "revision": "abc123", "contract": "1.4"}
    assert out["truncated"] is True and out["dedup"] is True
    assert out["meta"] == {"id": 1}
    assert out["timing"] == {"queue_ms": 1.5, "infer_ms": 3.25, "batch_size": 8, "padded_len": 32}


@BOTH
def test_ok_classify_reply_fields(encoding: Encoding) -> None:
    out = wire(ok_classify(), encoding)
    assert out["result"] == {
        "label": "POSITIVE",
        "score": 0.9,
        "scores": {"NEGATIVE": 0.1, "POSITIVE": 0.9},
    }


@BOTH
@pytest.mark.parametrize("code", list(ErrorCode))
def test_error_reply_carries_code_and_message_and_no_result_or_timing(
    encoding: Encoding, code: ErrorCode
) -> None:
    out = wire(error_reply(code), encoding)
    assert out["status"] == "error"
    assert out["error"] == {"code": code.value, "message": "why"}
    assert "result" not in out and "timing" not in out and "meta" not in out
    assert out["truncated"] is False and out["dedup"] is False


@BOTH
def test_expired_reply_has_deadline_exceeded(encoding: Encoding) -> None:
    out = wire(expired_reply(meta={"id": 3}), encoding)
    assert out["status"] == "expired"
    assert out["error"]["code"] == "deadline_exceeded"
    assert out["meta"] == {"id": 3}


def test_error_codes_are_the_contracts() -> None:
    assert [code.value for code in ErrorCode] == [
        "invalid_request",
        "unsupported_task",
        "unsupported_version",
        "input_too_long",
        "deadline_exceeded",
        "inference_failed",
        "invalid_option",
        "reply_topic_not_allowed",
        "idempotency_key_reused",
    ]
    # error replies, not dead letters: the records are well-formed
    assert ErrorCode.INVALID_OPTION not in DEAD_LETTER_CODES
    assert ErrorCode.IDEMPOTENCY_KEY_REUSED not in DEAD_LETTER_CODES


@BOTH
def test_model_revision_null_when_unknown(encoding: Encoding) -> None:
    reply = error_reply(model=ModelInfo(name="m"))
    assert wire(reply, encoding)["model"] == {"name": "m", "revision": None, "contract": "1.4"}


@pytest.mark.parametrize(
    "build",
    [
        lambda: Reply(status="ok", model=MODEL, timing=TIMING),  # no result
        lambda: Reply(status="ok", result=EmbedResult(embedding=[1.0], dim=1), model=MODEL),
        lambda: Reply(
            status="ok",
            result=EmbedResult(embedding=[1.0], dim=1),
            timing=TIMING,
            error=ErrorInfo(code=ErrorCode.INFERENCE_FAILED, message="x"),
            model=MODEL,
        ),
        lambda: Reply(status="error", model=MODEL),  # no error
        lambda: Reply(
            status="error",
            error=ErrorInfo(code=ErrorCode.INFERENCE_FAILED, message="x"),
            result=EmbedResult(embedding=[1.0], dim=1),
            model=MODEL,
        ),
        lambda: Reply(
            status="expired",
            error=ErrorInfo(code=ErrorCode.INFERENCE_FAILED, message="x"),
            model=MODEL,
        ),
        lambda: EmbedResult(embedding=[1.0, 2.0], dim=3),
        lambda: EmbedResult(embedding=[math.nan], dim=1),
        lambda: ClassifyResult(label="X", score=1.0, scores={"Y": 1.0}),
        lambda: Reply(status="pending", model=MODEL),  # type: ignore[arg-type]
        lambda: Timing(queue_ms=-1.0, infer_ms=1.0, batch_size=1, padded_len=1),
        lambda: Timing(queue_ms=1.0, infer_ms=1.0, batch_size=True, padded_len=1),
    ],
)
def test_reply_model_rejects_shapes_the_contract_forbids(build: Callable[[], object]) -> None:
    with pytest.raises(ValidationError):
        build()


def test_msgpack_embedding_is_float32_other_floats_float64() -> None:
    reply = ok_embed([0.1, -0.2, 0.3], meta={"f": 0.1})
    value = encode_reply(reply, MSGPACK)
    assert value.count(b"\xca") >= 3  # three msgpack float32 markers
    out = msgpack.unpackb(value)
    assert out["result"]["embedding"] == [
        struct.unpack(">f", struct.pack(">f", x))[0] for x in (0.1, -0.2, 0.3)
    ]
    assert out["meta"]["f"] == 0.1  # float64, exact
    assert out["timing"]["queue_ms"] == 1.5
    assert len(value) < len(encode_reply(reply, JSON)) + 40


def test_json_embedding_is_exact() -> None:
    values = [0.1, 1 / 3, -2.220446049250313e-16]
    assert json.loads(encode_reply(ok_embed(values), JSON))["result"]["embedding"] == values


def test_embedding_beyond_float32_range_cannot_be_encoded_in_msgpack() -> None:
    with pytest.raises(EncodeError):
        encode_reply(ok_embed([1e39]), MSGPACK)
    assert decode_reply(encode_reply(ok_embed([1e39]), JSON), JSON).result == EmbedResult(
        embedding=[1e39], dim=1
    )


@pytest.mark.parametrize("n", [1, 16, 70_000])  # each msgpack array header: fix, 16, 32
@pytest.mark.parametrize("bad", [1e39, -math.inf, -FLOAT32_MAX * (1 + 2**-30)])  # last: rounds
def test_embedding_beyond_float32_is_refused_at_any_length(n: int, bad: float) -> None:
    def wire(values: list[float]) -> dict[str, Any]:
        return {"v": 1, "status": "ok", "result": {"embedding": values, "dim": len(values)}}

    with pytest.raises(EncodeError, match="does not fit a float32"):
        encode_reply_wire(wire([0.25] * (n - 1) + [bad]), MSGPACK)
    edge = [0.25] * (n - 1) + [-FLOAT32_MAX]  # the largest float32 itself fits
    assert msgpack.unpackb(encode_reply_wire(wire(edge), MSGPACK))["result"]["embedding"] == edge


@pytest.mark.parametrize("fmt", ["f32le", "f16le", "binary"])
def test_chunks_in_bytes_are_base64_in_json_and_decode_as_in_msgpack(fmt: EncodingFormat) -> None:
    """Bytes travel in JSON as base64 wherever they are in a result: each chunk's embedding
    too (contract 1.3), not only a top-level one."""
    vectors = [[0.5, -0.25, 1.0, 0.0, -2.0, 3.5, 0.125, -1.0, 4.0], [1.0] * 9]
    chunks = [
        {"embedding": encode_embedding(v, fmt), "start": 5 * i, "end": 5 * i + 5}
        for i, v in enumerate(vectors)
    ]
    result = result_from_map({"chunks": chunks, "dim": 9, "format": fmt})
    wire = Reply(status="ok", result=result, model=MODEL, timing=TIMING).to_wire()
    value = encode_reply_wire(wire, JSON)
    first = json.loads(value)["result"]["chunks"][0]["embedding"]
    assert base64.b64decode(first, validate=True) == chunks[0]["embedding"]
    from_json, from_msgpack = (
        decode_reply(encode_reply_wire(wire, encoding), encoding) for encoding in (JSON, MSGPACK)
    )
    assert from_json == from_msgpack
    assert isinstance(from_json.result, ChunkedEmbedResult)
    for chunk, vector in zip(from_json.result.chunks, vectors, strict=True):
        back = decode_embedding(chunk.embedding, fmt, 9)
        expected = np.sign(vector).clip(0) if fmt == "binary" else vector
        assert back.tolist() == pytest.approx(expected, abs=1e-3)
    assert wire["result"]["chunks"][0]["embedding"] == chunks[0]["embedding"]  # left unchanged


def test_binary_meta_cannot_be_encoded_in_json() -> None:
    with pytest.raises(EncodeError):
        encode_reply(error_reply(meta={"b": b"\x00"}), JSON)
    with pytest.raises(EncodeError):
        encode_request(Request(text="x", meta={"b": b"\x00"}), JSON)


def test_the_contract_docs_reply_table_names_the_revision_replies_carry() -> None:
    """docs/CONTRACT.md's reply table shows ``model.contract`` as the server sends it."""
    doc = (Path(__file__).parents[2] / "docs" / "CONTRACT.md").read_text(encoding="utf-8")
    (row,) = [line for line in doc.splitlines() if line.startswith("| `model` | always |")]
    shown = re.search(r'"contract": "([0-9.]+)"', row)
    assert shown is not None, row
    sent = wire(ok_embed([1.0]), MSGPACK)["model"]["contract"]
    assert shown.group(1) == sent == CONTRACT_REVISION


@BOTH
def test_reply_round_trips(encoding: Encoding) -> None:
    for reply in (
        ok_embed([0.5, 0.25]),
        ok_classify(meta={"a": [1]}),
        error_reply(),
        expired_reply(),
    ):
        assert decode_reply(encode_reply(reply, encoding), encoding) == reply


@BOTH
def test_decode_reply_rejects_invalid_values(encoding: Encoding) -> None:
    bad_values: list[Any] = [{"v": 1, "status": "ok"}, [], {"v": 2, "status": "ok"}]
    for bad in bad_values:
        with pytest.raises(DecodeError):
            decode_reply(enc(bad, encoding), encoding)


@BOTH
def test_decode_reply_ignores_unknown_fields(encoding: Encoding) -> None:
    raw = wire(error_reply(), encoding) | {"future": 1}
    raw["error"]["hint"] = "x"
    assert decode_reply(enc(raw, encoding), encoding) == error_reply()


@BOTH
def test_request_encoder_leaves_absent_fields_off(encoding: Encoding) -> None:
    value = encode_request(Request(text="x", task="embed"), encoding)
    raw = msgpack.unpackb(value) if encoding is MSGPACK else json.loads(value)
    assert raw == {"v": 1, "text": "x", "task": "embed"}


def test_decode_error_is_one_hierarchy_and_pickles() -> None:
    import pickle

    from schemas.errors import ContractError

    error = rejects(enc({"text": ""}, MSGPACK))
    assert isinstance(error, ContractError) and not error.retriable
    again = pickle.loads(pickle.dumps(error))
    assert (again.code, again.message) == (error.code, error.message)


def test_result_from_map_builds_the_typed_result() -> None:
    embed = result_from_map({"embedding": [0.6, 0.8], "dim": 2})
    assert embed == EmbedResult(embedding=[0.6, 0.8], dim=2)
    classify = result_from_map({"label": "a", "score": 0.9, "scores": {"a": 0.9, "b": 0.1}})
    assert isinstance(classify, ClassifyResult) and classify.label == "a"
    with pytest.raises(ValidationError):
        result_from_map({"dim": 2})


# --- the serving path's shortcuts -------------------------------------------------------------


def test_a_remembered_content_type_decodes_as_before() -> None:
    for _ in range(2):  # the second read comes from the cache
        assert Encoding.from_content_type(b"application/json; charset=utf-8") is JSON
        assert Encoding.from_content_type(bytearray(b"application/json")) is JSON
        with pytest.raises(DecodeError):
            Encoding.from_content_type(b"text/plain")


def test_a_failed_encode_leaves_the_shared_packer_clean() -> None:
    good = encode_reply(ok_embed([0.5, 0.25]), MSGPACK)
    with pytest.raises(EncodeError):
        encode_reply(error_reply(meta={"x": object()}), MSGPACK)  # type: ignore[dict-item]
    with pytest.raises(EncodeError):
        encode_reply(ok_embed([1e39]), MSGPACK)
    assert encode_reply(ok_embed([0.5, 0.25]), MSGPACK) == good


def _ok_wire(**changes: Any) -> dict[str, Any] | None:
    args: dict[str, Any] = {
        "model": MODEL.model_dump(),
        "result": {"embedding": [0.5, 0.25], "dim": 2},
        "timing": (1.5, 3.25, 8, 32),
    }
    args.update(changes)
    return reply_wire("ok", **args)


@pytest.mark.parametrize(
    "changes",
    [
        {"result": {"embedding": [math.nan, 0.0], "dim": 2}},
        {"result": {"embedding": [math.inf, 0.0], "dim": 2}},
        {"result": {"embedding": [0.5], "dim": 2}},
        {"result": {"embedding": [], "dim": 0}},
        {"result": {"label": "a", "score": math.nan, "scores": {"a": 0.5}}},
        {"result": {"label": "c", "score": 0.5, "scores": {"a": 0.5}}},
        {"result": {"label": "a", "score": 0.5, "scores": {"a": True}}},
        {"result": None},
        {"timing": None},
        {"timing": (-1.0, 1.0, 1, 1)},
        {"timing": (1.0, 1.0, 0, 1)},
        {"truncated": 1},
    ],
)
def test_reply_wire_leaves_what_it_cannot_vouch_for_to_the_model(changes: dict[str, Any]) -> None:
    assert _ok_wire(**changes) is None


def test_reply_wire_gives_to_wire_for_ints_where_floats_are_expected() -> None:
    wire = _ok_wire(
        result={"label": "a", "score": 1, "scores": {"a": 1, "b": 0}}, timing=(1, 2, 1, 0)
    )
    reply = Reply(
        status="ok",
        result=ClassifyResult(label="a", score=1, scores={"a": 1, "b": 0}),
        model=MODEL,
        timing=Timing(queue_ms=1, infer_ms=2, batch_size=1, padded_len=0),
    )
    assert wire == reply.to_wire()
    assert reply_wire("expired", model={}, error=(ErrorCode.INPUT_TOO_LONG, "x")) is None
    assert reply_wire("error", model={}, error=("no_such_code", "x")) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("priority", ["live", "bulk"])
def test_priority_round_trips_and_other_values_are_invalid_request(priority: str) -> None:
    """Contract 1.2 ``priority``: encoded by clients, decoded; ``LIVE`` is no value."""
    request = Request.model_validate({"text": "t", "priority": priority})
    assert decode_request(encode_request(request)).priority == priority
    with pytest.raises(DecodeError) as err:
        decode_request(msgpack.packb({"text": "t", "priority": priority.upper()}))
    assert err.value.code is ErrorCode.INVALID_REQUEST
