"""Text extraction from application events (dotted paths, JSON/msgpack/raw) and the output
record a scored event becomes (pure, table-driven)."""

from __future__ import annotations

import json
from typing import Any

import msgpack
import pytest

from consumer.backfill.extract import (
    ExtractError,
    ValueFormat,
    extract_text,
    output_record,
    parse_text_path,
)
from consumer.batching.types import ItemOutcome
from consumer.replies.builder import ReplyBuilder
from schemas.codec import Encoding, decode_reply
from schemas.errors import ErrorCode
from schemas.models import ModelInfo

JSON_CT = [("content-type", b"application/json")]
MSGPACK_CT = [("content-type", b"application/msgpack")]


def _j(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def _m(obj: Any) -> bytes:
    return bytes(msgpack.packb(obj))


EVENT = {"id": 7, "payload": {"body": {"text": "héllo"}, "tags": ["a", {"t": "second"}]}}


@pytest.mark.parametrize(
    ("dotted", "expected"),
    [
        (None, None),
        ("text", ("text",)),
        ("a.b.c", ("a", "b", "c")),
        ("items.0.t", ("items", "0", "t")),
    ],
)
def test_parse_text_path(dotted: str | None, expected: tuple[str, ...] | None) -> None:
    assert parse_text_path(dotted) == expected


@pytest.mark.parametrize("dotted", ["", ".a", "a.", "a..b"])
def test_parse_text_path_rejects_empty_parts(dotted: str) -> None:
    with pytest.raises(ValueError, match="non-empty names"):
        parse_text_path(dotted)


@pytest.mark.parametrize(
    ("value", "headers", "path", "fmt", "text", "encoding"),
    [
        # raw UTF-8: the whole value, msgpack out
        ("héllo wörld".encode(), [], None, "auto", "héllo wörld", Encoding.MSGPACK),
        (b'{"text": "x"}', JSON_CT, None, "auto", '{"text": "x"}', Encoding.MSGPACK),
        (b"   ", [], None, "auto", "   ", Encoding.MSGPACK),  # whitespace is text
        # JSON by header, by sniffing (leading whitespace too), or forced
        (_j(EVENT), JSON_CT, "payload.body.text", "auto", "héllo", Encoding.JSON),
        (_j(EVENT), [], "payload.body.text", "auto", "héllo", Encoding.JSON),
        (b" \n" + _j(EVENT), [], "payload.body.text", "auto", "héllo", Encoding.JSON),
        (_j(EVENT), [], "payload.body.text", "json", "héllo", Encoding.JSON),
        (b'["x", {"t": "in a list"}]', [], "1.t", "auto", "in a list", Encoding.JSON),
        # msgpack by header, by sniffing, forced; binary map keys
        (_m(EVENT), MSGPACK_CT, "payload.body.text", "auto", "héllo", Encoding.MSGPACK),
        (_m(EVENT), [], "payload.tags.1.t", "auto", "second", Encoding.MSGPACK),
        (_m(EVENT), JSON_CT, "payload.body.text", "msgpack", "héllo", Encoding.MSGPACK),
        (_m({b"text": "bin key"}), [], "text", "auto", "bin key", Encoding.MSGPACK),
        # the last content-type counts; an application's own type falls back to sniffing
        (_j(EVENT), [*MSGPACK_CT, *JSON_CT], "id.x" if False else "payload.body.text", "auto",
         "héllo", Encoding.JSON),
        (_j(EVENT), [("content-type", b"application/vnd.acme+json")], "payload.body.text",
         "auto", "héllo", Encoding.JSON),
        (_m(EVENT), [("content-type", None)], "payload.body.text", "auto", "héllo",
         Encoding.MSGPACK),
    ],
)  # fmt: skip
def test_extract_text(
    value: bytes,
    headers: list[tuple[str, bytes | None]],
    path: str | None,
    fmt: ValueFormat,
    text: str,
    encoding: Encoding,
) -> None:
    got = extract_text(value, headers, parse_text_path(path), value_format=fmt)
    assert (got.text, got.encoding) == (text, encoding)


@pytest.mark.parametrize(
    ("value", "path", "message"),
    [
        (None, None, "value is null"),
        (None, "text", "value is null"),
        (b"\xff\xfe", None, "not UTF-8 text"),
        (b"", None, "the value is an empty string"),
        (b'{"text": ', "text", "not valid JSON"),
        (b"{" * 100_000, "text", "not valid JSON"),  # nesting bomb
        (b"\xc1", "text", "not valid msgpack"),
        (_m({"text": "x"}) + b"\x00", "text", "not valid msgpack"),  # trailing bytes
        (_j({"other": "x"}), "text", "field text: the value has no 'text'"),
        (_j(EVENT), "payload.body.missing", "payload.body has no 'missing'"),
        (_j(EVENT), "payload.tags.5", "is a list of 2; '5' is not an index"),
        (_j(EVENT), "payload.tags.x", "'x' is not an index"),
        (_j(EVENT), "id.x", "field id.x: id is a number, not a map"),
        (_j(EVENT), "payload.body.text.x", "payload.body.text is a string, not a map"),
        (_j(EVENT), "payload", "field payload is a map, not a string"),
        (_j(EVENT), "id", "field id is a number, not a string"),
        (_j({"text": None}), "text", "field text is null, not a string"),
        (_j({"text": True}), "text", "field text is a boolean"),
        (_j({"text": ""}), "text", "field text is an empty string"),
        (_j({"text": "\ud800"}), "text", "lone surrogate"),
        (_m({"text": b"bytes"}), "text", "field text is binary"),
        (_j([1, 2]), "text", "is a list of 2"),
        (_j("just a string"), "text", "the value is a string, not a map"),
    ],
)
def test_extract_text_errors_name_the_field_and_rule(
    value: bytes | None, path: str | None, message: str
) -> None:
    with pytest.raises(ExtractError, match=message):
        extract_text(value, [], parse_text_path(path))


def test_a_msgpack_map_read_as_text_says_which_field_to_name() -> None:
    """A serve request topic holds msgpack maps; read without --text-field, each dead letter
    says so and names a string field."""
    with pytest.raises(ExtractError) as info:
        extract_text(_m({"v": 1, "text": "cats", "meta": {}}), [], None)
    message = str(info.value)
    assert message.startswith("the value is not UTF-8 text (byte 0)")
    assert "it is a msgpack map (keys v, text, meta)" in message
    assert message.endswith("--text-field names the text, e.g. --text-field text")
    for not_a_map in (b"\xff\xfe", _m([1, 2]), _m({1: 2})):
        with pytest.raises(ExtractError) as info:
            extract_text(not_a_map, [], None)
        assert "--text-field" not in str(info.value)


@pytest.mark.parametrize(
    ("value", "value_format", "message"),
    [
        (
            b"hello world",
            "auto",
            "not valid msgpack: 10 bytes follow the first object (it reads "
            "as plain text, not a map",
        ),
        (
            b'{"text": ',
            "msgpack",
            "8 bytes follow the first object (it starts like JSON: --value-format json)",
        ),
        (b"", "msgpack", "not valid msgpack: empty"),
        (b"\x81\xa4te", "msgpack", "not valid msgpack: cut short"),
        (b"\xc1", "msgpack", "not valid msgpack: malformed"),
        (b'{"text": ', "json", "not valid JSON: Expecting value at line 1 column 10"),
        (b"\xff\xfe", "json", "not valid JSON: "),
    ],
)
def test_a_value_that_does_not_parse_says_what_is_wrong_and_where(
    value: bytes, value_format: Any, message: str
) -> None:
    """Not only the exception's class name (``ExtraData``, ``JSONDecodeError``)."""
    with pytest.raises(ExtractError) as info:
        extract_text(value, [], ("text",), value_format=value_format)
    assert message in str(info.value)
    assert "ExtraData" not in str(info.value) and "JSONDecodeError" not in str(info.value)


def test_extract_text_size_limit_counts_utf8_bytes() -> None:
    assert extract_text("é".encode() * 5, [], None, max_text_bytes=10).text == "é" * 5
    with pytest.raises(ExtractError, match="is 12 bytes of UTF-8; at most 10"):
        extract_text(_j({"t": "é" * 6}), [], ("t",), max_text_bytes=10)


def test_error_messages_never_repeat_the_input() -> None:
    secret = "s3cr3t-payload"
    for value, path in [
        (_j({"x": secret}), ("text",)),
        (_j({"text": [secret]}), ("text",)),
        (secret.encode() + b"\xff", None),
    ]:
        with pytest.raises(ExtractError) as info:
            extract_text(value, [], path)
        assert secret not in str(info.value)


def test_output_record_keys_and_headers() -> None:
    out = output_record(
        topic="scores",
        key=b"k1",
        value=b"v",
        encoding=Encoding.JSON,
        status="ok",
        source_topic="events",
        source_partition=2,
        source_offset=12345,
    )
    assert (out.topic, out.partition, out.key, out.value) == ("scores", None, b"k1", b"v")
    assert out.headers == [
        ("content-type", b"application/json"),
        ("kbatch-status", b"ok"),
        ("kbatch.source.topic", b"events"),
        ("kbatch.source.partition", b"2"),
        ("kbatch.source.offset", b"12345"),
    ]
    assert output_record(
        topic="o", key=None, value=b"", encoding=Encoding.MSGPACK, status="error",
        source_topic="e", source_partition=0, source_offset=0,
    ).key is None  # fmt: skip


# ---- ReplyBuilder.reply: the contract's reply value without a request around it -----------------

MODEL = ModelInfo(name="tiny", revision="r1")


def _outcome(**kw: Any) -> ItemOutcome:
    base: dict[str, Any] = dict(
        item_id=1, status="ok", result={"embedding": [0.6, 0.8], "dim": 2}, error_code=None,
        error_message=None, truncated=True, n_tokens=9, queue_ms=1.5, infer_ms=2.5,
        batch_size=4, padded_len=12,
    )  # fmt: skip
    return ItemOutcome(**{**base, **kw})


@pytest.mark.parametrize("encoding", [Encoding.MSGPACK, Encoding.JSON])
def test_reply_value_ok_round_trips(encoding: Encoding) -> None:
    from schemas.codec import encode_reply

    reply = ReplyBuilder(MODEL, "dlq").reply(_outcome())
    back = decode_reply(encode_reply(reply, encoding), encoding)
    assert back.status == "ok" and back.model == MODEL and back.truncated and not back.dedup
    assert back.meta is None and back.error is None
    assert back.timing is not None and (back.timing.batch_size, back.timing.padded_len) == (4, 12)


def test_reply_value_error_and_same_as_from_outcome() -> None:
    builder = ReplyBuilder(MODEL, "dlq")
    err = _outcome(status="error", result=None, error_code="input_too_long", error_message="m")
    reply = builder.reply(err)
    assert reply.status == "error" and reply.error is not None
    assert reply.error.code is ErrorCode.INPUT_TOO_LONG and reply.result is None
    assert reply.timing is None


def test_reply_value_rejects_unknown_error_code() -> None:
    with pytest.raises(ValueError):
        ReplyBuilder(MODEL, "dlq").reply(_outcome(status="error", result=None, error_code="nope"))
