"""Bytes ⇄ models for request and reply values, in msgpack or JSON (CONTRACT.md §Request record).

Decoding never trusts its input. In order, ``decode_request``:

1. checks the value's size against a limit derived from ``max_text_bytes`` and
   ``max_meta_bytes`` (``max_request_bytes``), before any parsing;
2. msgpack: walks the headers without building objects (``_scan_msgpack``), rejecting
   truncation, trailing bytes, nesting deeper than ``MAX_DEPTH`` and more than ``MAX_ITEMS``
   values, then unpacks with ``max_str_len``/``max_bin_len``/``max_ext_len`` (the size limit) and
   ``max_array_len``/``max_map_len`` (``MAX_ITEMS``), UTF-8-strict strings and string or
   binary map keys only.
   JSON: decodes strict UTF-8 (no BOM, no UTF-16 sniffing), parses rejecting ``NaN``,
   ``±Infinity`` and numbers that overflow a double, turns ``RecursionError`` on deep nesting
   into a decode error, then walks the tree iteratively with the same depth and count limits;
3. reads ``v`` first (an integer other than 1 is ``unsupported_version``, whatever else is
   wrong), then validates the map against ``Request`` (strict types; unknown fields ignored),
   then the UTF-8 size of ``text`` and the size of ``meta`` re-encoded in the request's encoding.

Every failure is a ``DecodeError`` with the contract's code and a message naming the rule; no
other exception escapes (property-tested with arbitrary bytes, msgpack and JSON).

On the msgpack wire the floats of ``result.embedding`` are msgpack float32 (5 bytes each);
every other float is float64, so ``meta`` and scores are exact. JSON floats are exact (shortest
round-trip repr). Bytes in a result (an embedding as ``f32le``, ``f16le``, ``binary``, contract
1.1; each chunk's, 1.3; sparse indices and values, 1.2) are msgpack ``bin``, and in JSON a
standard base64 string with padding, wherever they appear in it. Both encodings write maps in
the models' field order.
"""

from __future__ import annotations

import base64
import json
import math
import threading
from collections.abc import Callable
from enum import StrEnum
from typing import Any, Final, NoReturn

import msgpack
from pydantic import ValidationError

from schemas.errors import DecodeError, EncodeError, ErrorCode
from schemas.models import EMBED_OPTIONS, TASK_OPTIONS, Reply, Request

__all__ = [
    "DEFAULT_MAX_META_BYTES",
    "DEFAULT_MAX_REPLY_BYTES",
    "DEFAULT_MAX_TEXT_BYTES",
    "EXTRA_VALUE_BYTES",
    "MAX_DEPTH",
    "MAX_ITEMS",
    "MAX_REPLY_ITEMS",
    "Encoding",
    "decode_reply",
    "decode_request",
    "encode_reply",
    "encode_reply_wire",
    "encode_request",
    "header_text",
    "max_request_bytes",
    "reads_as_text",
]

DEFAULT_MAX_TEXT_BYTES: Final = 512 * 1024
"""Default limit on ``text`` in UTF-8 bytes (CONTRACT.md §Request record: 512 KiB)."""

DEFAULT_MAX_META_BYTES: Final = 4096
"""Limit on ``meta`` re-encoded in the request's encoding (CONTRACT.md: 4 KiB)."""

EXTRA_VALUE_BYTES: Final = 64 * 1024
"""Room in a request value beyond ``text`` and ``meta``: other fields, unknown fields, framing."""

JSON_ESCAPE_FACTOR: Final = 6
"""A UTF-8 byte of ``text`` takes at most 6 bytes in JSON (``\\u0001`` for a control byte)."""

MAX_DEPTH: Final = 32
"""Deepest nesting of maps/arrays accepted; the top-level map is depth 1 (``meta`` 2)."""

MAX_ITEMS: Final = 65_536
"""Most msgpack objects in a request (a map entry counts 2: key and value)."""

DEFAULT_MAX_REPLY_BYTES: Final = 16 * 1024 * 1024
"""Size limit for ``decode_reply`` (a client reading replies)."""

MAX_REPLY_ITEMS: Final = 1_048_576
"""Most objects in a reply (room for large embeddings)."""

FLOAT32_MAX: Final = 3.4028234663852886e38


def header_text(raw: bytes, name: str) -> str:
    """A request header's value as text (the contract's headers are UTF-8).

    Raises:
        DecodeError: ``invalid_request`` when ``raw`` is not valid UTF-8.
    """
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise DecodeError(
            ErrorCode.INVALID_REQUEST, f"the {name} header is not valid UTF-8"
        ) from None


class Encoding(StrEnum):
    """Encoding of a value, named by the ``content-type`` header; the reply uses the request's."""

    MSGPACK = "application/msgpack"
    JSON = "application/json"

    @classmethod
    def from_content_type(cls, header: bytes | None) -> Encoding:
        """The encoding a ``content-type`` header value names.

        No header means msgpack. Matching ignores case, surrounding spaces and parameters
        (``application/json; charset=utf-8`` is JSON; JSON is UTF-8 regardless).

        Raises:
            DecodeError: ``invalid_request`` for non-UTF-8 bytes or an unknown media type
                (CONTRACT.md §Request record: an unknown content-type is invalid_request).
        """
        if header is None:
            return cls.MSGPACK
        known = _KNOWN_CONTENT_TYPES.get(header) if type(header) is bytes else None
        if known is not None:
            return known
        text = header_text(header, "content-type")
        media_type = text.split(";", 1)[0].strip().lower()
        for encoding in cls:
            if media_type == encoding.value:
                if len(_KNOWN_CONTENT_TYPES) < _MAX_KNOWN_CONTENT_TYPES:
                    _KNOWN_CONTENT_TYPES[bytes(header)] = encoding
                return encoding
        raise DecodeError(
            ErrorCode.INVALID_REQUEST,
            f"unknown content-type {text[:100]!r}; use application/msgpack or application/json",
        )


_KNOWN_CONTENT_TYPES: dict[bytes, Encoding] = {}
"""Header values already read (every record carries one; parsing it costs ~3 µs)."""

_MAX_KNOWN_CONTENT_TYPES: Final = 64
"""At most this many distinct values are remembered (a client may vary parameters)."""


def max_request_bytes(
    encoding: Encoding,
    max_text_bytes: int = DEFAULT_MAX_TEXT_BYTES,
    max_meta_bytes: int = DEFAULT_MAX_META_BYTES,
) -> int:
    """Largest request value accepted before parsing, in bytes.

    msgpack: ``max_text_bytes + max_meta_bytes + EXTRA_VALUE_BYTES``; JSON counts the text as
    ``JSON_ESCAPE_FACTOR * max_text_bytes`` since escapes may inflate it.
    """
    text_room = (
        max_text_bytes if encoding is Encoding.MSGPACK else JSON_ESCAPE_FACTOR * max_text_bytes
    )
    return text_room + max_meta_bytes + EXTRA_VALUE_BYTES


# --------------------------------------------------------------------------------------------
# Parsing with limits


def _fail(what: str, reason: str) -> NoReturn:
    raise DecodeError(ErrorCode.INVALID_REQUEST, f"the {what} value {reason}")


# msgpack header byte → (kind, n). Kinds: a scalar whose payload is n bytes; a str/bin whose
# length takes n bytes; an ext whose length takes n bytes (plus a type byte); an array/map whose
# count takes n bytes; a fixarray/fixmap of n entries; the never-used byte 0xc1.
_SCALAR, _VAR, _EXT, _ARRAY, _MAP, _FIXARRAY, _FIXMAP, _BAD = range(8)


def _header_table() -> tuple[tuple[int, int], ...]:
    table: list[tuple[int, int]] = []
    special: dict[int, tuple[int, int]] = {
        0xC0: (_SCALAR, 0), 0xC1: (_BAD, 0), 0xC2: (_SCALAR, 0), 0xC3: (_SCALAR, 0),
        0xC4: (_VAR, 1), 0xC5: (_VAR, 2), 0xC6: (_VAR, 4),
        0xC7: (_EXT, 1), 0xC8: (_EXT, 2), 0xC9: (_EXT, 4),
        0xCA: (_SCALAR, 4), 0xCB: (_SCALAR, 8),
        0xCC: (_SCALAR, 1), 0xCD: (_SCALAR, 2), 0xCE: (_SCALAR, 4), 0xCF: (_SCALAR, 8),
        0xD0: (_SCALAR, 1), 0xD1: (_SCALAR, 2), 0xD2: (_SCALAR, 4), 0xD3: (_SCALAR, 8),
        0xD4: (_SCALAR, 2), 0xD5: (_SCALAR, 3), 0xD6: (_SCALAR, 5), 0xD7: (_SCALAR, 9),
        0xD8: (_SCALAR, 17),
        0xD9: (_VAR, 1), 0xDA: (_VAR, 2), 0xDB: (_VAR, 4),
        0xDC: (_ARRAY, 2), 0xDD: (_ARRAY, 4), 0xDE: (_MAP, 2), 0xDF: (_MAP, 4),
    }  # fmt: skip
    for byte in range(256):
        if byte <= 0x7F or byte >= 0xE0:
            table.append((_SCALAR, 0))  # positive / negative fixint
        elif byte <= 0x8F:
            table.append((_FIXMAP, byte & 0x0F))
        elif byte <= 0x9F:
            table.append((_FIXARRAY, byte & 0x0F))
        elif byte <= 0xBF:
            table.append((_SCALAR, byte & 0x1F))  # fixstr
        else:
            table.append(special[byte])
    return tuple(table)


_HEADERS: Final = _header_table()


def _scan_msgpack(data: bytes, *, what: str, max_depth: int, max_items: int) -> None:
    """Check the structure of one msgpack object without building it or recursing.

    Walks headers with an explicit stack of "objects still to read" per open container, so a
    forged length or count costs nothing and deep nesting costs one list entry per level until
    ``max_depth`` stops it. Work is at most ``max_items`` steps.

    Raises:
        DecodeError: ``invalid_request`` for truncation, trailing bytes, the byte 0xc1, nesting
            deeper than ``max_depth`` or more than ``max_items`` objects.
    """
    end = len(data)
    pos = 0
    items = 0
    to_read = [1]  # index 0: the top-level object; one entry per open container after it
    while to_read:
        if to_read[-1] == 0:
            to_read.pop()
            continue
        to_read[-1] -= 1
        if pos >= end:
            _fail(what, "is not valid msgpack: it ends in the middle of an object")
        kind, n = _HEADERS[data[pos]]
        pos += 1
        items += 1
        if items > max_items:
            _fail(what, f"holds more than {max_items} msgpack objects")
        if kind == _SCALAR:
            pos += n
            continue
        if kind == _BAD:
            _fail(what, f"is not valid msgpack: byte 0xc1 (never used) at offset {pos - 1}")
        if kind in (_FIXARRAY, _FIXMAP):
            count = n
        else:
            if pos + n > end:
                _fail(what, "is not valid msgpack: it ends in the middle of a length")
            length = int.from_bytes(data[pos : pos + n], "big")
            pos += n
            if kind == _VAR:
                pos += length
                continue
            if kind == _EXT:
                pos += 1 + length
                continue
            count = length
        if kind in (_MAP, _FIXMAP):
            count *= 2
        if count > end - pos:  # every object takes at least one byte
            _fail(
                what, "is not valid msgpack: a container claims more entries than there are bytes"
            )
        if len(to_read) > max_depth:
            _fail(what, f"is nested deeper than {max_depth} levels")
        to_read.append(count)
    if pos > end:
        _fail(what, "is not valid msgpack: it ends in the middle of an object")
    if pos < end:
        _fail(what, f"is not valid msgpack: {end - pos} bytes follow the first object")


def _check_tree(root: object, *, what: str, max_depth: int, max_items: int) -> None:
    """Depth and size limits on a parsed JSON tree, iteratively (no recursion).

    Counts objects as msgpack would (a map entry is 2), to the same limits.
    """
    if not isinstance(root, dict | list):
        return
    items = 1
    stack: list[tuple[dict[str, Any] | list[Any], int]] = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            _fail(what, f"is nested deeper than {max_depth} levels")
        children = node.values() if isinstance(node, dict) else node
        items += 2 * len(node) if isinstance(node, dict) else len(node)
        if items > max_items:
            _fail(what, f"holds more than {max_items} values")
        for child in children:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))


class _NonFinite(ValueError):
    pass


def _reject_constant(name: str) -> NoReturn:
    raise _NonFinite(name)


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise _NonFinite(literal)
    return value


JSON_WITHOUT_HEADER_HINT = (
    "it reads as JSON: send it with the header content-type: application/json "
    "(msgpack is the default)"
)
"""Appended to a msgpack error whose value is a JSON object or array."""


PLAIN_TEXT_HINT = (
    'it reads as plain text: a request is a map with a "text" field (msgpack, or JSON with '
    "the header content-type: application/json)"
)
"""Appended to a msgpack error whose value is printable UTF-8 text that is not JSON."""


def reads_as_text(data: bytes) -> bool:
    """True when ``data`` is non-empty printable UTF-8 text (what a client sends when it puts
    the text itself on the topic; whitespace counts as printable)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return bool(text) and all(c.isprintable() or c.isspace() for c in text[:4096])


def _reads_as_json(data: bytes) -> bool:
    """True when ``data`` is a JSON object or array (what a JSON client sends without the
    ``content-type`` header). A msgpack value never parses so: ``{`` and ``[`` are a msgpack
    positive fixint and JSON requires the rest of the bytes to close them."""
    head = data.lstrip()[:1]
    if head not in (b"{", b"["):
        return False
    try:
        json.loads(data)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return False
    return True


def _load(value: bytes, encoding: Encoding, *, what: str, max_bytes: int, max_items: int) -> object:
    """Parse ``value`` into plain Python objects under every limit; see the module docstring."""
    data = bytes(value)
    if len(data) > max_bytes:
        _fail(what, f"is {len(data)} bytes; at most {max_bytes} are accepted")
    if not data:
        _fail(what, "is empty")
    if encoding is Encoding.MSGPACK:
        try:
            _scan_msgpack(data, what=what, max_depth=MAX_DEPTH, max_items=max_items)
        except DecodeError as exc:
            if _reads_as_json(data):  # the commonest cause: a JSON value sent without the header
                raise DecodeError(exc.code, f"{exc.message}; {JSON_WITHOUT_HEADER_HINT}") from None
            if reads_as_text(data):  # the next: the text alone, not a request map
                raise DecodeError(exc.code, f"{exc.message}; {PLAIN_TEXT_HINT}") from None
            raise
        try:
            return msgpack.unpackb(
                data,
                raw=False,
                strict_map_key=True,
                use_list=True,
                max_str_len=max_bytes,
                max_bin_len=max_bytes,
                max_ext_len=max_bytes,
                max_array_len=max_items,
                max_map_len=max_items,
            )
        except UnicodeDecodeError as exc:
            _fail(what, f"is not valid msgpack: a string is not valid UTF-8 ({exc.reason})")
        except (ValueError, TypeError, OverflowError, msgpack.UnpackException) as exc:
            if "strict_map_key" in str(exc):
                _fail(what, "is not accepted: a map key is neither a string nor binary")
            # e.g. a malformed timestamp ext.
            _fail(what, f"is not valid msgpack ({type(exc).__name__}: {str(exc)[:200]})")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        _fail(what, f"is not valid UTF-8 (byte offset {exc.start}: {exc.reason})")
    try:
        tree = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except _NonFinite as exc:
        _fail(what, f"holds the number {str(exc)[:40]}, which JSON does not allow (NaN/Infinity)")
    except RecursionError:
        _fail(what, f"is nested deeper than {MAX_DEPTH} levels")
    except json.JSONDecodeError as exc:
        _fail(what, f"is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}")
    except ValueError as exc:  # int longer than sys.get_int_max_str_digits()
        _fail(what, f"is not valid JSON: {str(exc)[:200]}")
    _check_tree(tree, what=what, max_depth=MAX_DEPTH, max_items=max_items)
    return tree


# --------------------------------------------------------------------------------------------
# Request


def _wire_type(value: object) -> str:
    names: dict[type, str] = {
        bool: "a boolean",
        int: "an integer",
        float: "a float",
        str: "a string",
        bytes: "binary",
        list: "an array",
        dict: "a map",
        type(None): "null",
    }
    return names.get(type(value), type(value).__name__)


def _describe(exc: ValidationError, obj: dict[Any, Any], what: str) -> str:
    parts: list[str] = []
    for error in exc.errors(include_url=False, include_input=False)[:3]:
        loc = ".".join(str(p) for p in error["loc"]) or what
        kind = error["type"]
        if kind == "missing":
            parts.append(f"field {loc} is required")
        elif kind == "string_too_short" and loc == "text":
            parts.append("field text must not be empty")
        else:
            got = ""
            if len(error["loc"]) == 1 and error["loc"][0] in obj:
                got = f" (got {_wire_type(obj[error['loc'][0]])})"
            message = error["msg"].removeprefix("Value error, ")
            if kind == "string_unicode":
                message = "holds a lone surrogate (\\ud800-\\udfff), which is not valid Unicode"
            parts.append(f"field {loc}: {message}{got}")
    return "invalid " + what + ": " + "; ".join(parts)


class _Packers(threading.local):
    """One pair of msgpack packers per thread, built once (a Packer costs ~1 µs to build and
    is not thread-safe). ``f64``: bytes stay msgpack bin, floats stay float64 (meta is echoed
    exactly); ``f32``: the same with float32 floats (``result.embedding`` only). A pack that
    raises leaves its packer empty (msgpack resets the buffer), so reuse is safe."""

    def __init__(self) -> None:
        self.f64 = msgpack.Packer(use_bin_type=True, use_single_float=False)
        self.f32 = msgpack.Packer(use_bin_type=True, use_single_float=True)


_PACKERS: Final = _Packers()


def _pack(obj: object) -> bytes:
    return _PACKERS.f64.pack(obj)


def _dump_json(obj: object) -> bytes:
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.encode("utf-8")


def _meta_problem(meta: object, encoding: Encoding, max_meta_bytes: int) -> str | None:
    """Why ``meta`` is not acceptable, or None when it is (absent/null is acceptable)."""
    if meta is None:
        return None
    if not isinstance(meta, dict):
        return f"field meta must be a map (got {_wire_type(meta)})"
    if not all(isinstance(key, str) for key in meta):
        return "field meta must have string keys"
    try:
        size = len(_pack(meta) if encoding is Encoding.MSGPACK else _dump_json(meta))
    except UnicodeEncodeError:
        return "field meta holds a lone surrogate (\\ud800-\\udfff), which is not valid Unicode"
    except (ValueError, TypeError, OverflowError) as exc:
        return f"field meta cannot be re-encoded ({str(exc)[:200]})"
    if size > max_meta_bytes:
        return (
            f"field meta is {size} bytes in {encoding.name}; at most {max_meta_bytes} are accepted"
        )
    return None


def decode_request(
    value: bytes,
    encoding: Encoding = Encoding.MSGPACK,
    *,
    max_text_bytes: int = DEFAULT_MAX_TEXT_BYTES,
    max_meta_bytes: int = DEFAULT_MAX_META_BYTES,
) -> Request:
    """Decode and validate a request value (CONTRACT.md §Request record).

    Args:
        value: the record value.
        encoding: from ``Encoding.from_content_type`` (msgpack when no header).
        max_text_bytes: limit on ``text`` in UTF-8 bytes.
        max_meta_bytes: limit on ``meta`` re-encoded compactly in ``encoding`` (msgpack:
            ``packb``; JSON: no spaces, UTF-8 not ``\\u`` escapes) — the size it has when echoed.

    Raises:
        DecodeError: ``unsupported_version`` when ``v`` is an integer other than 1; else
            ``invalid_request`` for an oversized, undecodable or invalid value. ``.meta``
            carries the request's ``meta`` when it was valid, for the error reply.
    """
    if encoding is Encoding.MSGPACK:
        plain = _plain_text_request(value, max_text_bytes)
        if plain is not None:
            # model_validate's own validator, without its Python wrapper (1.7 → 1.1 µs).
            request: Request = Request.__pydantic_validator__.validate_python(plain)
            return request
    return _decode_request_fully(value, encoding, max_text_bytes, max_meta_bytes)


_PLAIN_PREFIXES: Final = (b"\x82\xa1v\x01\xa4text", b"\x81\xa4text")
"""How a msgpack request of ``{"v": 1, "text": …}`` (what :func:`encode_request` writes for a
request with no options) or of ``{"text": …}`` begins, up to the text's string header."""

_STR_LENGTH_BYTES: Final = {0xD9: 1, 0xDA: 2, 0xDB: 4}
"""msgpack str8/16/32: how many big-endian length bytes follow the header byte."""


def _plain_text_request(value: bytes, max_text_bytes: int) -> dict[str, Any] | None:
    """The fast path of :func:`decode_request`: the map of a msgpack request that holds nothing
    but a non-empty ``text`` of at most ``max_text_bytes`` (and ``v`` = 1, written first, as
    kbatch's clients write it), read from its bytes; None for any other value.

    The common request skips the structure walk, the unpacker and the checks of fields it does
    not have (≈ 13 µs of the ≈ 15 µs a request cost); what it returns passes every rule of the
    full path, so ``Request.model_validate`` of it is the full path's result. Anything else —
    other fields, another order, invalid UTF-8, an empty or too long text, trailing bytes —
    returns None and takes the full path, which alone words the errors (the two are compared
    by a property test).
    """
    for prefix in _PLAIN_PREFIXES:
        if value.startswith(prefix):
            break
    else:
        return None
    pos = len(prefix)
    if pos >= len(value):
        return None
    header = value[pos]
    if 0xA1 <= header <= 0xBF:  # fixstr of 1-31 bytes (0xA0, the empty string, is invalid)
        start, length = pos + 1, header & 0x1F
    elif header in _STR_LENGTH_BYTES:
        start = pos + 1 + _STR_LENGTH_BYTES[header]
        length = int.from_bytes(value[pos + 1 : start], "big")
    else:
        return None
    if length == 0 or length > max_text_bytes or start + length != len(value):
        return None
    try:
        text = value[start:].decode("utf-8")  # strict: as the unpacker, no lone surrogates
    except UnicodeDecodeError:
        return None
    return {"v": 1, "text": text} if prefix[0] == 0x82 else {"text": text}


def _decode_request_fully(
    value: bytes, encoding: Encoding, max_text_bytes: int, max_meta_bytes: int
) -> Request:
    """:func:`decode_request` for any value: every check in the module docstring's order."""
    max_bytes = max_request_bytes(encoding, max_text_bytes, max_meta_bytes)
    if len(value) > max_bytes:
        _fail(
            "request",
            f"is {len(value)} bytes; at most {max_bytes} are accepted in {encoding.name.lower()} "
            f"(text up to {max_text_bytes} bytes, meta up to {max_meta_bytes})",
        )
    obj = _load(value, encoding, what="request", max_bytes=max_bytes, max_items=MAX_ITEMS)
    if not isinstance(obj, dict):
        _fail("request", f"must be a map, not {_wire_type(obj)}")
    meta_problem = _meta_problem(obj.get("meta"), encoding, max_meta_bytes)
    echo = obj.get("meta") if meta_problem is None else None

    version = obj.get("v")
    if version is not None and type(version) is not int:
        raise DecodeError(
            ErrorCode.INVALID_REQUEST,
            f"field v must be an integer (got {_wire_type(version)})",
            meta=echo,
        )
    if version is not None and version != 1:
        shown = str(version) if abs(version) < 10**20 else "a very large integer"
        raise DecodeError(
            ErrorCode.UNSUPPORTED_VERSION,
            f"contract version {shown} is not supported; this server speaks version 1",
            meta=echo,
        )
    if "v" in obj and version is None:
        obj = {name: field for name, field in obj.items() if name != "v"}  # null counts as absent
    try:
        request = Request.model_validate(obj)
    except ValidationError as exc:
        raise DecodeError(
            ErrorCode.INVALID_REQUEST, _describe(exc, obj, "request"), meta=echo
        ) from None
    try:
        text_bytes = len(request.text.encode("utf-8"))
    except UnicodeEncodeError:
        raise DecodeError(
            ErrorCode.INVALID_REQUEST,
            "field text holds a lone surrogate (\\ud800-\\udfff), which is not valid Unicode",
            meta=echo,
        ) from None
    if text_bytes > max_text_bytes:
        raise DecodeError(
            ErrorCode.INVALID_REQUEST,
            f"field text is {text_bytes} bytes of UTF-8; at most {max_text_bytes} are accepted",
            meta=echo,
        )
    if meta_problem is not None:
        raise DecodeError(ErrorCode.INVALID_REQUEST, meta_problem)
    return request


def encode_request(request: Request, encoding: Encoding = Encoding.MSGPACK) -> bytes:
    """Encode a request value (for clients); fields that are None are left off.

    Raises:
        EncodeError: when ``meta`` holds something the encoding cannot carry.
    """
    wire: dict[str, Any] = {"v": request.v, "text": request.text}
    for name in (
        "task",
        "deadline_ms",
        "truncate",
        "meta",
        *EMBED_OPTIONS,
        *TASK_OPTIONS,
        "priority",
    ):
        field = getattr(request, name)
        if field is not None:
            wire[name] = field.model_dump() if name == "chunking" else field
    return _encode(wire, encoding, _pack)


def _encode(wire: dict[str, Any], encoding: Encoding, pack: Callable[[Any], bytes]) -> bytes:
    try:
        return pack(wire) if encoding is Encoding.MSGPACK else _dump_json(wire)
    except (ValueError, TypeError, OverflowError) as exc:  # UnicodeEncodeError is a ValueError
        raise EncodeError(f"cannot encode as {encoding.name}: {str(exc)[:200]}") from exc


# --------------------------------------------------------------------------------------------
# Reply


def _pack_reply(wire: dict[str, Any]) -> bytes:
    """msgpack with ``result.embedding`` as float32, everything else as ``_pack`` does."""
    f64 = _PACKERS.f64
    result = wire.get("result")
    if not (isinstance(result, dict) and "embedding" in result):
        return f64.pack(wire)
    embedding: list[float] | bytes = result["embedding"]
    if type(embedding) is bytes:
        return f64.pack(wire)  # msgpack bin
    try:
        packed = _PACKERS.f32.pack(embedding)  # refuses a finite value beyond float32
    except OverflowError:
        packed = b""
    if not packed or (
        not _plainly_float32(packed, len(embedding))
        and (max(embedding) > FLOAT32_MAX or min(embedding) < -FLOAT32_MAX)
    ):
        raise ValueError("an embedding value does not fit a float32")
    parts = [f64.pack_map_header(len(wire))]
    for name, field in wire.items():
        parts.append(f64.pack(name))
        if name != "result":
            parts.append(f64.pack(field))
            continue
        parts.append(f64.pack_map_header(len(result)))
        for result_name, result_field in result.items():
            parts.append(f64.pack(result_name))
            if result_name == "embedding":
                parts.append(packed)
            else:
                parts.append(f64.pack(result_field))
    return b"".join(parts)


def _plainly_float32(packed: bytes, n: int) -> bool:
    """Whether msgpack array ``packed`` holds ``n`` float32s, none ±Infinity or ±FLOAT32_MAX
    (what a value beyond float32 packs as or rounds to): ~0.5 µs for 384, ``max``/``min`` ~9."""
    start = 1 if n < 16 else 3 if n < 65536 else 5  # the array header's bytes
    exponents = packed[start + 1 :: 5]  # the first byte after each 0xCA
    return len(packed) == start + 5 * n and b"\x7f" not in exponents and b"\xff" not in exponents


def encode_reply(reply: Reply, encoding: Encoding) -> bytes:
    """Encode a reply value in the request's encoding (CONTRACT.md §Reply record).

    msgpack writes a float embedding as float32 (values round to the nearest float32); JSON
    writes exact floats. Bytes in the result (at any depth) are msgpack ``bin`` / JSON base64.

    Raises:
        EncodeError: when ``meta`` holds something the encoding cannot carry, or an embedding
            value overflows float32.
    """
    return encode_reply_wire(reply.to_wire(), encoding)


def encode_reply_wire(wire: dict[str, Any], encoding: Encoding) -> bytes:
    """Encode a reply given in wire form, without validating it: ``Reply.to_wire()``, or
    ``schemas.models.reply_wire`` on the serving path (same keys, order and value types, so
    the same bytes as :func:`encode_reply`).

    Raises:
        EncodeError: as :func:`encode_reply`.
    """
    if encoding is Encoding.JSON:
        result = wire.get("result")
        if isinstance(result, dict):
            based = _bytes_as_base64(result)
            if based is not result:
                wire = {**wire, "result": based}
    return _encode(wire, encoding, _pack_reply)


_NESTED: Final = (dict, list, bytes)


def _bytes_as_base64(node: Any) -> Any:
    """``node`` (a reply's ``result`` or a part of it) with every ``bytes`` in it, at any depth,
    a standard base64 string with padding: f32le/f16le/binary embeddings, each chunk's (1.3),
    f32le/f16le sparse indices and values (1.2). The same object when it holds no bytes.

    A list is walked only when its first item is a map, a list or bytes (the contract's lists
    hold one kind each), so an embedding's floats are not visited one by one; bytes left in a
    mixed list make the JSON encoding fail (``EncodeError``), never pass unconverted.
    """
    kind = type(node)
    if kind is bytes:
        return base64.b64encode(node).decode("ascii")
    if kind is dict:
        based = {name: _bytes_as_base64(v) for name, v in node.items()}
        changed = any(based[name] is not v for name, v in node.items())
        return based if changed else node
    if kind is list and node and type(node[0]) in _NESTED:
        items = [_bytes_as_base64(v) for v in node]
        changed = any(b is not v for b, v in zip(items, node, strict=True))
        return items if changed else node
    return node


def decode_reply(
    value: bytes,
    encoding: Encoding = Encoding.MSGPACK,
    *,
    max_value_bytes: int = DEFAULT_MAX_REPLY_BYTES,
) -> Reply:
    """Decode and validate a reply value (for clients), with the same hostile-input limits.

    ``encoding`` comes from the reply's ``content-type`` header.

    Raises:
        DecodeError: ``unsupported_version`` when ``v`` is not 1, else ``invalid_request``
            (the code only says the value is invalid; read ``.message``).
    """
    obj = _load(value, encoding, what="reply", max_bytes=max_value_bytes, max_items=MAX_REPLY_ITEMS)
    if not isinstance(obj, dict):
        _fail("reply", f"must be a map, not {_wire_type(obj)}")
    version = obj.get("v")
    if type(version) is int and version != 1:
        raise DecodeError(ErrorCode.UNSUPPORTED_VERSION, "reply version is not 1")
    try:
        return Reply.model_validate(obj)
    except ValidationError as exc:
        raise DecodeError(ErrorCode.INVALID_REQUEST, _describe(exc, obj, "reply")) from None
