"""Property tests (hypothesis) for the codec and the record parser.

- every valid request and reply round-trips in both encodings;
- arbitrary bytes, arbitrary msgpack, arbitrary JSON and mutated valid values never make a
  decoder raise anything but ``DecodeError`` (``RecordDecodeError`` for records).

Example counts (``settings(max_examples=…)``) add up to more than 10,000 decode cases per run;
``database=None`` keeps runs independent of local state, ``deadline=None`` avoids flaky timing.
"""

from __future__ import annotations

import contextlib
import json
import math
import struct
from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas import headers as h
from schemas.codec import (
    DEFAULT_MAX_META_BYTES,
    DEFAULT_MAX_TEXT_BYTES,
    Encoding,
    _decode_request_fully,
    _plain_text_request,
    decode_reply,
    decode_request,
    encode_reply,
    encode_reply_wire,
    encode_request,
)
from schemas.errors import DecodeError, ErrorCode
from schemas.models import (
    ENCODING_FORMATS,
    ClassifyResult,
    EmbedResult,
    ErrorInfo,
    ModelInfo,
    Reply,
    Request,
    Timing,
    Usage,
    embedding_bytes,
    reply_wire,
)
from schemas.records import (
    RecordDecodeError,
    build_dead_letter,
    build_error_reply,
    parse_request_record,
)

MSGPACK, JSON = Encoding.MSGPACK, Encoding.JSON
encodings = st.sampled_from([MSGPACK, JSON])


def fuzz(n: int) -> settings:
    return settings(
        max_examples=n,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# --- strategies -------------------------------------------------------------------------------

unicode_text = st.text(st.characters(codec="utf-8"), max_size=40)  # no surrogates
int64 = st.integers(-(2**63), 2**63 - 1)
finite = st.floats(allow_nan=False, allow_infinity=False)
float32 = st.floats(width=32, allow_nan=False, allow_infinity=False)

json_scalars = st.none() | st.booleans() | int64 | finite | unicode_text
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(unicode_text, inner, max_size=4),
    max_leaves=8,
)
meta_maps = st.dictionaries(unicode_text, json_values, max_size=4)

requests = st.builds(
    Request,
    text=st.text(st.characters(codec="utf-8"), min_size=1, max_size=200),
    task=st.none() | st.sampled_from(["embed", "classify"]),
    deadline_ms=st.none() | st.integers(0, 2**63 - 1),
    truncate=st.none() | st.booleans(),
    meta=st.none() | meta_maps,
    dimensions=st.none() | st.integers(1, 2**40),
    normalize=st.none() | st.booleans(),
    prompt_name=st.none() | unicode_text,
    encoding_format=st.none() | st.sampled_from(ENCODING_FORMATS),
)

models = st.builds(
    ModelInfo,
    name=unicode_text,
    revision=st.none() | unicode_text,
    contract=st.none() | st.just("1.1"),
)
timings = st.builds(
    Timing,
    queue_ms=st.floats(0, 1e9),
    infer_ms=st.floats(0, 1e9),
    batch_size=st.integers(1, 4096),
    padded_len=st.integers(0, 8192),
)


@st.composite
def embed_results(draw: st.DrawFn, values: st.SearchStrategy[float]) -> EmbedResult:
    fmt = draw(st.sampled_from(ENCODING_FORMATS))
    if fmt == "float":
        embedding = draw(st.lists(values, min_size=1, max_size=64))
        return EmbedResult(embedding=embedding, dim=len(embedding))
    dim = draw(st.integers(1, 64))
    size = embedding_bytes(fmt, dim)
    assert size is not None
    raw = draw(st.binary(min_size=size, max_size=size))
    return EmbedResult(embedding=raw, dim=dim, format=fmt)


@st.composite
def classify_results(draw: st.DrawFn) -> ClassifyResult:
    scores = draw(st.dictionaries(unicode_text, finite, min_size=1, max_size=6))
    label = draw(st.sampled_from(sorted(scores)))
    return ClassifyResult(label=label, score=scores[label], scores=scores)


@st.composite
def replies(draw: st.DrawFn, embed_values: st.SearchStrategy[float]) -> Reply:
    status = draw(st.sampled_from(["ok", "error", "expired"]))
    common: dict[str, Any] = {
        "model": draw(models),
        "truncated": draw(st.booleans()),
        "dedup": draw(st.booleans()),
        "meta": draw(st.none() | meta_maps),
    }
    if status == "ok":
        result = draw(embed_results(embed_values) | classify_results())
        usage = draw(st.none() | st.builds(Usage, tokens=st.integers(0, 100_000)))
        return Reply(status="ok", result=result, timing=draw(timings), usage=usage, **common)
    if status == "expired":
        info = ErrorInfo(code=ErrorCode.DEADLINE_EXCEEDED, message=draw(unicode_text))
        return Reply(status="expired", error=info, **common)
    info = ErrorInfo(code=draw(st.sampled_from(ErrorCode)), message=draw(unicode_text))
    return Reply(status="error", error=info, **common)


# --- round trips ------------------------------------------------------------------------------


@fuzz(400)
@given(request=requests, encoding=encodings)
def test_valid_request_round_trips(request: Request, encoding: Encoding) -> None:
    assert decode_request(encode_request(request, encoding), encoding) == request


@fuzz(300)
@given(reply=replies(float32))
def test_valid_reply_round_trips_in_msgpack(reply: Reply) -> None:
    # Embedding values that are float32 survive msgpack's float32 exactly.
    assert decode_reply(encode_reply(reply, MSGPACK), MSGPACK) == reply


@fuzz(300)
@given(reply=replies(finite))
def test_valid_reply_round_trips_in_json(reply: Reply) -> None:
    assert decode_reply(encode_reply(reply, JSON), JSON) == reply


@fuzz(100)
@given(embedding=st.lists(st.floats(-1e30, 1e30), min_size=1, max_size=64))
def test_msgpack_embedding_rounds_to_nearest_float32(embedding: list[float]) -> None:
    reply = Reply(
        status="ok",
        result=EmbedResult(embedding=embedding, dim=len(embedding)),
        model=ModelInfo(name="m"),
        timing=Timing(queue_ms=0, infer_ms=0, batch_size=1, padded_len=1),
    )
    back = decode_reply(encode_reply(reply, MSGPACK), MSGPACK).result
    assert isinstance(back, EmbedResult)
    expected = [struct.unpack(">f", struct.pack(">f", x))[0] for x in embedding]
    assert back.embedding == expected


def test_reply_wire_takes_finite_values_whose_sum_overflows() -> None:
    # Found by the property below: the fast path's "finite sum ⇒ all finite" shortcut must
    # not turn two large finite floats (sum = inf) into a refusal.
    big = [8.988465674311579e307, 8.98846567431158e307]
    wire = reply_wire(
        "ok",
        model={"name": "m", "revision": None},
        result={"embedding": big, "dim": 2},
        timing=(0.0, 0.0, 1, 1),
    )
    assert wire is not None and wire["result"] == {"embedding": big, "dim": 2, "format": "float"}


@fuzz(400)
@given(reply=replies(finite), encoding=encodings)
def test_the_serving_paths_reply_wire_is_the_models(reply: Reply, encoding: Encoding) -> None:
    # reply_wire skips pydantic on the serving path: same dict, same bytes as Reply.to_wire().
    result = None if reply.result is None else reply.result.model_dump()
    error = None if reply.error is None else (reply.error.code, reply.error.message)
    timing = None
    if reply.timing is not None:
        t = reply.timing
        timing = (t.queue_ms, t.infer_ms, t.batch_size, t.padded_len)
    wire = reply_wire(
        reply.status,
        model=reply.model.model_dump(),
        result=result,
        error=error,
        truncated=reply.truncated,
        dedup=reply.dedup,
        meta=reply.meta,
        timing=timing,
        usage_tokens=None if reply.usage is None else reply.usage.tokens,
    )
    assert wire == reply.to_wire()
    assert list(wire) == list(reply.to_wire())  # wire order too
    typed = reply.result
    if (
        encoding is MSGPACK
        and isinstance(typed, EmbedResult)
        and isinstance(typed.embedding, list)
        and max(map(abs, typed.embedding)) > 3.4028234663852886e38
    ):
        return  # not encodable in msgpack either way
    assert encode_reply_wire(wire, encoding) == encode_reply(reply, encoding)


# --- decoders only ever raise DecodeError -----------------------------------------------------


def decodes_or_decode_error(value: bytes, encoding: Encoding) -> None:
    try:
        request = decode_request(value, encoding, max_text_bytes=64, max_meta_bytes=128)
    except DecodeError as exc:
        assert exc.message and exc.code in {
            ErrorCode.INVALID_REQUEST,
            ErrorCode.UNSUPPORTED_VERSION,
        }
        return
    assert isinstance(request, Request) and request.text


@fuzz(3000)
@given(value=st.binary(max_size=256))
def test_arbitrary_bytes_as_msgpack_request(value: bytes) -> None:
    decodes_or_decode_error(value, MSGPACK)


@fuzz(2000)
@given(value=st.binary(max_size=256))
def test_arbitrary_bytes_as_json_request(value: bytes) -> None:
    decodes_or_decode_error(value, JSON)


msgpack_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()  # NaN and ±inf included
    | st.text(max_size=20)
    | st.binary(max_size=20)
    | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=12))
)
FIELDS = ["text", "task", "deadline_ms", "truncate", "meta", "v", "other"]
field_names = st.sampled_from(FIELDS)


def request_like(scalars: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Maps with the request's field names holding scalars or one level of containers: cheap
    to generate, and they reach every validation rule."""
    shallow = (
        scalars
        | st.lists(scalars, max_size=3)
        | st.dictionaries(st.text(max_size=4), scalars, max_size=3)
    )
    return st.fixed_dictionaries({}, optional={name: shallow for name in FIELDS})


def trees(scalars: st.SearchStrategy[Any], keys: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Arbitrary nested values (maps keyed by ``keys``)."""
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=3),
        max_leaves=8,
    )


@fuzz(800)
@given(obj=request_like(msgpack_scalars))
def test_arbitrary_msgpack_request_map(obj: Any) -> None:
    decodes_or_decode_error(msgpack.packb(obj, use_bin_type=True), MSGPACK)


@fuzz(300)
@given(obj=trees(msgpack_scalars, st.text(max_size=4) | st.binary(max_size=4) | field_names))
def test_arbitrary_msgpack_value(obj: Any) -> None:
    decodes_or_decode_error(msgpack.packb(obj, use_bin_type=True), MSGPACK)


json_scalars_any = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)


def json_bytes(obj: Any) -> bytes:
    # allow_nan writes NaN/Infinity literals; lone surrogates are kept as \u escapes.
    return json.dumps(obj, allow_nan=True).encode("utf-8")


@fuzz(800)
@given(obj=request_like(json_scalars_any))
def test_arbitrary_json_request_map(obj: Any) -> None:
    decodes_or_decode_error(json_bytes(obj), JSON)


@fuzz(300)
@given(obj=trees(json_scalars_any, st.text(max_size=4) | field_names))
def test_arbitrary_json_value(obj: Any) -> None:
    decodes_or_decode_error(json_bytes(obj), JSON)


@fuzz(500)
@given(text=st.text(max_size=60))
def test_arbitrary_text_as_json(text: str) -> None:
    decodes_or_decode_error(text.encode("utf-8", "surrogatepass"), JSON)


flat_requests = st.builds(
    Request,
    text=st.text(st.characters(codec="utf-8"), min_size=1, max_size=40),
    task=st.none() | st.sampled_from(["embed", "classify"]),
    deadline_ms=st.none() | st.integers(0, 2**63 - 1),
    truncate=st.none() | st.booleans(),
    meta=st.none() | st.dictionaries(st.text(max_size=4), json_scalars, max_size=3),
)


@fuzz(800)
@given(
    request=flat_requests,
    encoding=encodings,
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.none() | st.integers(0, 10_000),
)
def test_mutated_valid_request(
    request: Request, encoding: Encoding, edits: list[tuple[int, int]], cut: int | None
) -> None:
    value = bytearray(encode_request(request, encoding))
    for position, byte in edits:
        value[position % len(value)] = byte
    if cut is not None:
        del value[cut % len(value) :]
    decodes_or_decode_error(bytes(value), encoding)


@fuzz(1500)
@given(value=st.binary(max_size=256), encoding=encodings)
def test_arbitrary_bytes_as_reply(value: bytes, encoding: Encoding) -> None:
    with contextlib.suppress(DecodeError):
        decode_reply(value, encoding)


header_names = st.sampled_from(
    [h.REPLY_TOPIC, h.REPLY_PARTITION, h.CORRELATION_ID, h.CONTENT_TYPE, "x-other"]
)
header_values = (
    st.none()
    | st.binary(max_size=8)
    | st.sampled_from(
        [b"application/json", b"application/msgpack", b"replies", b"\x00\x00\x00\x01"]
    )
)


@fuzz(700)
@given(
    key=st.none() | st.binary(max_size=300),
    value=st.none() | st.binary(max_size=64) | flat_requests.map(encode_request),
    headers=st.lists(st.tuples(header_names, header_values), max_size=6),
)
def test_arbitrary_record_parses_or_yields_dead_letter_and_error_reply(
    key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]]
) -> None:
    try:
        parse_request_record(key, value, headers)
    except RecordDecodeError as exc:
        dead = build_dead_letter(key, value, headers, exc.code, exc.message, "t", 0, 1, "t.dlq")
        assert dead.key == key and dead.value == value
        assert dead.headers[: len(headers)] == headers
        if exc.addressable:
            reply = build_error_reply(exc, model=ModelInfo(name="m"))
            decoded = decode_reply(reply.value or b"", exc.reply_encoding)
            assert decoded.error is not None and decoded.error.code is exc.code


def test_nan_and_infinity_never_decode_from_json() -> None:
    for literal in ("NaN", "Infinity", "-Infinity", "1e999"):
        try:
            decode_request(f'{{"text":"x","meta":{{"f":{literal}}}}}'.encode(), JSON)
        except DecodeError:
            continue
        raise AssertionError(literal)
    assert not math.isfinite(float("1e999"))


# --- the plain-text fast path of decode_request ------------------------------------------------


def _full_or_error(value: bytes, max_text_bytes: int) -> Request | tuple[str, str, Any]:
    """The full path's verdict: the request, or the error's code, message and meta."""
    try:
        return _decode_request_fully(value, MSGPACK, max_text_bytes, DEFAULT_MAX_META_BYTES)
    except DecodeError as exc:
        return (exc.code, exc.message, exc.meta)


def _decoded_or_error(value: bytes, max_text_bytes: int) -> Request | tuple[str, str, Any]:
    try:
        return decode_request(value, MSGPACK, max_text_bytes=max_text_bytes)
    except DecodeError as exc:
        return (exc.code, exc.message, exc.meta)


plain_prefixes = st.sampled_from([b"\x82\xa1v\x01\xa4text", b"\x81\xa4text"])


@fuzz(1500)
@given(
    text=st.text(max_size=40) | st.text(min_size=30, max_size=300),
    with_v=st.booleans(),
    max_text_bytes=st.sampled_from([1, 8, 64, DEFAULT_MAX_TEXT_BYTES]),
)
def test_a_plain_text_request_decodes_as_the_full_path_decodes_it(
    text: str, with_v: bool, max_text_bytes: int
) -> None:
    """A request of a text (and v = 1) alone takes the fast path exactly when it is valid;
    accepted or refused, the answer is the full path's (fixstr, str8 and str16 headers)."""
    wire: dict[str, Any] = {"v": 1, "text": text} if with_v else {"text": text}
    value = msgpack.packb(wire, use_bin_type=True)
    assert _decoded_or_error(value, max_text_bytes) == _full_or_error(value, max_text_bytes)
    valid = bool(text) and len(text.encode("utf-8")) <= max_text_bytes
    assert (_plain_text_request(value, max_text_bytes) is not None) == valid


@fuzz(2000)
@given(prefix=plain_prefixes, rest=st.binary(max_size=40))
def test_bytes_after_a_plain_prefix_decode_as_the_full_path_decodes_them(
    prefix: bytes, rest: bytes
) -> None:
    """Arbitrary bytes after the fast path's prefix (forged lengths, trailing bytes, invalid
    UTF-8, other headers): the same request or the same error as the full path."""
    value = prefix + rest
    assert _decoded_or_error(value, 16) == _full_or_error(value, 16)


def test_a_lone_surrogate_in_a_plain_text_request_is_the_full_paths_error() -> None:
    value = b"\x81\xa4text\xa5ab" + "\ud800".encode("utf-8", "surrogatepass")
    assert _plain_text_request(value, 64) is None
    verdict = _decoded_or_error(value, 64)
    assert verdict == _full_or_error(value, 64)
    assert isinstance(verdict, tuple) and verdict[0] == ErrorCode.INVALID_REQUEST
