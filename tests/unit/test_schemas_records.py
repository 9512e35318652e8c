"""Request, reply and dead-letter records (CONTRACT.md §Request record headers and key,
§Reply record, §Dead letters). Pure: raw key/value/headers in, OutRecord out."""

from __future__ import annotations

import json
import struct
from typing import Any

import msgpack
import pytest

from schemas import headers as h
from schemas.codec import Encoding, decode_reply, encode_request
from schemas.errors import DEAD_LETTER_CODES, ErrorCode
from schemas.models import (
    EmbedResult,
    ErrorInfo,
    ModelInfo,
    Reply,
    Request,
    Timing,
)
from schemas.records import (
    MAX_KEY_BYTES,
    OutRecord,
    ParsedRequest,
    RecordDecodeError,
    ReplyAddress,
    build_dead_letter,
    build_error_reply,
    build_reply_record,
    parse_request_record,
)

MSGPACK, JSON = Encoding.MSGPACK, Encoding.JSON
MODEL = ModelInfo(name="m", revision=None)
KEY = b"req-0001"
CID = bytes(range(16))  # Spring sends a 16-byte correlation id
VALUE = encode_request(Request(text="hello", meta={"trace": "t1"}))
Headers = list[tuple[str, bytes | None]]


def partition_header(partition: int) -> bytes:
    return struct.pack(">i", partition)


def parse(key: bytes | None = KEY, value: bytes | None = VALUE, headers: Headers | None = None,
          **kw: Any) -> ParsedRequest:  # fmt: skip
    return parse_request_record(key, value, headers or [], **kw)


def parse_fails(key: bytes | None = KEY, value: bytes | None = VALUE,
                headers: Headers | None = None, **kw: Any) -> RecordDecodeError:  # fmt: skip
    with pytest.raises(RecordDecodeError) as info:
        parse_request_record(key, value, headers or [], **kw)
    return info.value


def ok_reply(**kw: Any) -> Reply:
    return Reply(
        status="ok",
        result=EmbedResult(embedding=[0.6, 0.8], dim=2),
        model=MODEL,
        timing=Timing(queue_ms=1.0, infer_ms=2.0, batch_size=1, padded_len=4),
        **kw,
    )


# --- request record: key ----------------------------------------------------------------------


def test_parsed_request_has_key_request_address_encoding() -> None:
    parsed = parse()
    assert parsed == ParsedRequest(
        key=KEY,
        request=Request(text="hello", meta={"trace": "t1"}),
        address=ReplyAddress(None, None, None),
        encoding=MSGPACK,
    )


@pytest.mark.parametrize("key", [None, b""], ids=["none", "empty"])
def test_missing_or_empty_key_is_invalid_request(key: bytes | None) -> None:
    error = parse_fails(key=key)
    assert error.code is ErrorCode.INVALID_REQUEST
    assert "key" in error.message
    assert error.key is None
    assert not error.addressable  # no key, no correlation id
    assert error.meta == {"trace": "t1"}  # the value still decoded


def test_key_of_256_bytes_is_accepted_257_is_not() -> None:
    assert MAX_KEY_BYTES == 256
    assert parse(key=b"k" * 256).key == b"k" * 256
    error = parse_fails(key=b"k" * 257)
    assert error.code is ErrorCode.INVALID_REQUEST and "257" in error.message
    assert error.key == b"k" * 257 and error.addressable


def test_tombstone_value_is_invalid_request() -> None:
    error = parse_fails(value=None)
    assert error.code is ErrorCode.INVALID_REQUEST and "value" in error.message


# --- request record: headers ------------------------------------------------------------------


def test_reply_headers_are_read_into_the_address() -> None:
    headers: Headers = [
        (h.REPLY_TOPIC, b"client-7.replies"),
        (h.REPLY_PARTITION, partition_header(3)),
        (h.CORRELATION_ID, CID),
    ]
    assert parse(headers=headers).address == ReplyAddress("client-7.replies", 3, CID)


def test_reply_partition_is_4_byte_big_endian() -> None:
    big = partition_header(0x01020304)
    assert big == b"\x01\x02\x03\x04"
    assert parse(headers=[(h.REPLY_PARTITION, big)]).address.partition == 0x01020304


@pytest.mark.parametrize(
    "raw", [b"\x00\x00\x03", b"\x00\x00\x00\x00\x03", b"", b"3"], ids=["3-bytes", "5", "0", "ascii"]
)
def test_malformed_reply_partition_is_invalid_request(raw: bytes) -> None:
    error = parse_fails(headers=[(h.REPLY_PARTITION, raw), (h.CORRELATION_ID, CID)])
    assert error.code is ErrorCode.INVALID_REQUEST
    assert h.REPLY_PARTITION in error.message
    assert error.address == ReplyAddress(None, None, CID)  # the rest is still recovered
    assert error.addressable


def test_negative_reply_partition_is_invalid_request() -> None:
    error = parse_fails(headers=[(h.REPLY_PARTITION, partition_header(-1))])
    assert error.code is ErrorCode.INVALID_REQUEST


@pytest.mark.parametrize("raw", [b"\xff\xfe", b"", b"has space", b"x" * 250, b".."])
def test_malformed_reply_topic_is_invalid_request(raw: bytes) -> None:
    error = parse_fails(headers=[(h.REPLY_TOPIC, raw)])
    assert error.code is ErrorCode.INVALID_REQUEST and h.REPLY_TOPIC in error.message
    assert error.address.topic is None


def test_correlation_id_is_opaque_bytes() -> None:
    odd = b"\x00\xff\xfe not utf-8 \x80"
    assert parse(headers=[(h.CORRELATION_ID, odd)]).address.correlation_id == odd


def test_last_header_of_a_name_wins_and_null_value_counts_as_absent() -> None:
    headers: Headers = [
        (h.REPLY_TOPIC, b"first"),
        (h.REPLY_TOPIC, b"second"),
        (h.CORRELATION_ID, CID),
        (h.CORRELATION_ID, None),
    ]
    assert parse(headers=headers).address == ReplyAddress("second", None, None)


@pytest.mark.parametrize(
    ("content_type", "encoding"),
    [(None, MSGPACK), (b"application/msgpack", MSGPACK), (b"application/json", JSON)],
)
def test_content_type_header_selects_the_encoding(
    content_type: bytes | None, encoding: Encoding
) -> None:
    headers: Headers = [] if content_type is None else [(h.CONTENT_TYPE, content_type)]
    value = encode_request(Request(text="x"), encoding)
    assert parse(value=value, headers=headers).encoding is encoding


@pytest.mark.parametrize("content_type", [b"text/plain", b"\xc3\x28"], ids=["unknown", "non-utf8"])
def test_unknown_or_non_utf8_content_type_gets_a_msgpack_error_reply(content_type: bytes) -> None:
    error = parse_fails(headers=[(h.CONTENT_TYPE, content_type), (h.CORRELATION_ID, CID)])
    assert error.code is ErrorCode.INVALID_REQUEST and "content-type" in error.message
    assert error.encoding is None and error.reply_encoding is MSGPACK
    record = build_error_reply(error, model=MODEL)
    assert (h.CONTENT_TYPE, b"application/msgpack") in record.headers
    assert decode_reply(record.value or b"", MSGPACK).error == ErrorInfo(
        code=ErrorCode.INVALID_REQUEST, message=error.message
    )


def test_first_problem_is_reported_but_everything_recoverable_is_kept() -> None:
    headers: Headers = [
        (h.CONTENT_TYPE, b"application/json"),
        (h.REPLY_TOPIC, b"replies-a"),
        (h.REPLY_PARTITION, b"\x00\x01"),
        (h.CORRELATION_ID, CID),
    ]
    value = json.dumps({"text": "", "meta": {"id": 9}}).encode()
    error = parse_fails(key=KEY, value=value, headers=headers)
    assert h.REPLY_PARTITION in error.message  # headers come before the value
    assert error.key == KEY and error.encoding is JSON
    assert error.address == ReplyAddress("replies-a", None, CID)
    assert error.meta == {"id": 9}


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (msgpack.packb({"text": "x", "v": 2}), ErrorCode.UNSUPPORTED_VERSION),
        (msgpack.packb({"text": ""}), ErrorCode.INVALID_REQUEST),
        (b"\xc1garbage", ErrorCode.INVALID_REQUEST),
    ],
)
def test_value_errors_carry_their_code(value: bytes, code: ErrorCode) -> None:
    assert parse_fails(value=value).code is code


def test_max_text_bytes_is_configurable() -> None:
    value = encode_request(Request(text="x" * 11))
    assert parse(value=value, max_text_bytes=11).request.text == "x" * 11
    assert parse_fails(value=value, max_text_bytes=10).code is ErrorCode.INVALID_REQUEST


# --- reply record -----------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", [MSGPACK, JSON])
def test_reply_record_goes_to_the_address_with_key_and_headers(encoding: Encoding) -> None:
    address = ReplyAddress("client.replies", 2, CID)
    key = b"\x00binary key\xff"
    reply = ok_reply(meta={"trace": "t1"})
    record = build_reply_record(reply, key=key, address=address, encoding=encoding)
    assert record.topic == "client.replies" and record.partition == 2
    assert record.key == key  # byte for byte
    assert record.headers == [
        (h.CORRELATION_ID, CID),
        (h.CONTENT_TYPE, encoding.value.encode()),
        (h.STATUS, b"ok"),
    ]
    assert decode_reply(record.value or b"", encoding).meta == {"trace": "t1"}


def test_reply_record_without_reply_headers_uses_configured_topic_and_partitioner() -> None:
    record = build_reply_record(ok_reply(), key=KEY, address=ReplyAddress(), encoding=MSGPACK)
    assert (record.topic, record.partition) == (None, None)
    assert [name for name, _ in record.headers] == [h.CONTENT_TYPE, h.STATUS]


TOO_LONG = ErrorInfo(code=ErrorCode.INPUT_TOO_LONG, message="x")
LATE = ErrorInfo(code=ErrorCode.DEADLINE_EXCEEDED, message="x")


@pytest.mark.parametrize(
    ("reply", "status"),
    [
        (ok_reply(), b"ok"),
        (Reply(status="error", error=TOO_LONG, model=MODEL), b"error"),
        (Reply(status="expired", error=LATE, model=MODEL), b"expired"),
    ],
)
def test_kbatch_status_header_is_the_replys_status(reply: Reply, status: bytes) -> None:
    record = build_reply_record(reply, key=KEY, address=ReplyAddress(), encoding=MSGPACK)
    assert dict(record.headers)[h.STATUS] == status


def test_reply_from_parsed_request_round_trip() -> None:
    headers: Headers = [(h.CONTENT_TYPE, b"application/json"), (h.CORRELATION_ID, CID)]
    parsed = parse(value=encode_request(Request(text="x", meta={"id": 1}), JSON), headers=headers)
    reply = ok_reply(meta=parsed.request.meta)
    record = build_reply_record(
        reply, key=parsed.key, address=parsed.address, encoding=parsed.encoding
    )
    assert decode_reply(record.value or b"", JSON) == reply
    assert json.loads(record.value or b"")["meta"] == {"id": 1}


# --- error reply and dead letters ------------------------------------------------------------


def test_addressable_bad_record_gets_an_error_reply_in_its_encoding() -> None:
    headers: Headers = [
        (h.CONTENT_TYPE, b"application/json"),
        (h.REPLY_TOPIC, b"mine"),
        (h.CORRELATION_ID, CID),
    ]
    error = parse_fails(value=b'{"text": 5, "meta": {"id": 4}}', headers=headers)
    record = build_error_reply(error, model=MODEL)
    assert isinstance(record, OutRecord)
    assert (record.topic, record.partition, record.key) == ("mine", None, KEY)
    assert record.headers == [
        (h.CORRELATION_ID, CID),
        (h.CONTENT_TYPE, b"application/json"),
        (h.STATUS, b"error"),
    ]
    reply = decode_reply(record.value or b"", JSON)
    assert reply.status == "error" and reply.error is not None
    assert reply.error.code is ErrorCode.INVALID_REQUEST and "text" in reply.error.message
    assert reply.meta == {"id": 4}  # meta echoed in the error reply too
    assert reply.model == MODEL and not reply.truncated and not reply.dedup


def test_record_with_only_a_correlation_id_is_addressable() -> None:
    error = parse_fails(key=None, headers=[(h.CORRELATION_ID, CID)])
    assert error.addressable
    record = build_error_reply(error, model=MODEL)
    assert record.key is None  # none for a record that had no key
    assert (h.CORRELATION_ID, CID) in record.headers


def test_unaddressable_record_gets_no_error_reply() -> None:
    error = parse_fails(key=b"")
    assert not error.addressable
    with pytest.raises(ValueError, match="neither a key nor"):
        build_error_reply(error, model=MODEL)


def test_dead_letter_keeps_the_original_and_adds_error_and_source_headers() -> None:
    original: Headers = [
        ("content-type", b"application/json"),
        ("x-trace", b"\x00\xff"),
        ("x-trace", b"again"),
        ("x-null", None),
    ]
    value = b'{"text": 5}'
    record = build_dead_letter(
        KEY,
        value,
        original,
        ErrorCode.INVALID_REQUEST,
        "field text: Input should be a valid string — ünïcode",
        "kbatch.requests",
        7,
        123456789012,
        "kbatch.requests.dlq",
    )
    assert record.topic == "kbatch.requests.dlq" and record.partition is None
    assert record.key == KEY and record.value == value
    assert record.headers[: len(original)] == original  # unchanged, order and repeats kept
    assert record.headers[len(original) :] == [
        (h.ERROR_CODE, b"invalid_request"),
        (h.ERROR_MESSAGE, "field text: Input should be a valid string — ünïcode".encode()),
        (h.SOURCE_TOPIC, b"kbatch.requests"),
        (h.SOURCE_PARTITION, b"7"),
        (h.SOURCE_OFFSET, b"123456789012"),
    ]


def test_dead_letter_of_a_keyless_tombstone_keeps_the_nulls() -> None:
    record = build_dead_letter(
        None, None, [], ErrorCode.INVALID_REQUEST, "no key", "t", 0, 0, "t.dlq"
    )
    assert record.key is None and record.value is None
    assert dict(record.headers)[h.ERROR_CODE] == b"invalid_request"


def test_dead_letter_codes_are_the_contracts() -> None:
    assert {
        ErrorCode.INVALID_REQUEST,
        ErrorCode.UNSUPPORTED_VERSION,
        ErrorCode.REPLY_TOPIC_NOT_ALLOWED,
    } == DEAD_LETTER_CODES


def test_out_record_has_no_instance_dict() -> None:
    # Slotted (per-request types; not frozen, for speed): a misspelt field cannot be added.
    record = build_reply_record(ok_reply(), key=KEY, address=ReplyAddress(), encoding=MSGPACK)
    with pytest.raises(AttributeError):
        record.topik = "other"  # type: ignore[attr-defined]


def test_record_decode_error_pickles_with_its_address() -> None:
    import pickle

    error = parse_fails(headers=[(h.REPLY_PARTITION, b"\x00"), (h.CORRELATION_ID, CID)])
    again = pickle.loads(pickle.dumps(error))
    assert isinstance(again, RecordDecodeError)
    assert (again.code, again.key, again.address) == (error.code, error.key, error.address)
