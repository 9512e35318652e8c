"""Pure parts of a backfill: the text of a source record, and the output record it becomes.

Source records are any application events (no contract): the text is

* the whole value as UTF-8 (no ``--text-field``), or
* the string at a dotted path (``--text-field payload.body.text``; a number indexes a list,
  ``items.0.text``) of a JSON or msgpack map. The encoding comes from ``--value-format``, or
  with ``auto`` from the ``content-type`` header (the last one, as the contract reads it),
  else from the first byte (``{``, ``[`` or ``"`` after whitespace: JSON; else msgpack).

A record whose text cannot be had raises :class:`ExtractError`; the job dead-letters it with
code ``invalid_request`` and the error's message (which names the field and the rule and never
repeats the input).

Output value encoding: **JSON when the source value was read as JSON, msgpack otherwise**
(raw UTF-8 and msgpack sources) — the contract's rule that a reply uses its request's encoding,
applied to events; the ``content-type`` header says which.
"""

from __future__ import annotations

import json
import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgpack

from schemas import headers as h
from schemas.codec import Encoding, reads_as_text
from schemas.errors import DecodeError
from schemas.models import MAX_DOCUMENTS
from schemas.records import OutRecord

__all__ = [
    "ExtractError",
    "Extracted",
    "TextPath",
    "ValueFormat",
    "extract_text",
    "output_record",
    "parse_text_path",
]

ValueFormat = Literal["auto", "json", "msgpack"]
TextPath = tuple[str, ...]
"""A parsed ``--text-field``: its dot-separated components."""

_JSON_START = frozenset(b'{["')  # in msgpack these bytes are bare small ints: no fields
_WHITESPACE = b" \t\r\n"


class ExtractError(ValueError):
    """The record has no usable text; ``str(err)`` is the dead letter's message."""


@dataclass(frozen=True, slots=True)
class Extracted:
    """A record's text and the encoding its output value uses."""

    text: str
    encoding: Encoding
    documents: tuple[str, ...] | None = None
    """rerank: the documents at ``--documents-field`` (the text is the query)."""


def parse_text_path(dotted: str | None) -> TextPath | None:
    """``"a.b.c"`` → ``("a", "b", "c")``; None stays None (the raw value is the text).

    Raises:
        ValueError: an empty path or an empty component (``"a..b"``, ``".a"``).
    """
    if dotted is None:
        return None
    parts = tuple(dotted.split("."))
    if not dotted or any(not p for p in parts):
        raise ValueError(f"text field {dotted!r} must be dot-separated non-empty names")
    return parts


def extract_text(
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]],
    path: TextPath | None,
    *,
    value_format: ValueFormat = "auto",
    max_text_bytes: int = 512 * 1024,
    documents_path: TextPath | None = None,
) -> Extracted:
    """The text of one source record (and, for rerank, its documents).

    Args:
        value: the record's value (None: a null value, e.g. a tombstone).
        headers: the record's headers (``content-type`` is read when ``value_format`` is auto).
        path: the parsed ``--text-field``; None: the whole value is UTF-8 text.
        value_format: how a value with a ``path`` is decoded.
        max_text_bytes: longest text accepted, in UTF-8 bytes (the contract's limit).
        documents_path: the parsed ``--documents-field`` (rerank; needs ``path``): a list of
            1 to :data:`~schemas.models.MAX_DOCUMENTS` non-empty strings, together at most
            ``max_text_bytes``.

    Raises:
        ExtractError: null value; not UTF-8; not JSON/msgpack; no map; the path missing or not
            a string; an empty text; a text over ``max_text_bytes``; documents missing, not a
            list of non-empty strings, more than 64 or too large.
    """
    if value is None:
        raise ExtractError("the record's value is null (a tombstone?): no text")
    if path is None:
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError as err:
            hint = _text_field_hint(value)
            raise ExtractError(f"the value is not UTF-8 text (byte {err.start}){hint}") from None
        return Extracted(_checked(text, "the value", max_text_bytes), Encoding.MSGPACK)
    encoding = _encoding(value, headers, value_format)
    document = _decode(value, encoding)
    node = _walk(document, path)
    field = ".".join(path)
    if not isinstance(node, str):
        raise ExtractError(f"field {field} is {_kind(node)}, not a string")
    text = _checked(node, f"field {field}", max_text_bytes)
    if documents_path is None:
        return Extracted(text, encoding)
    return Extracted(text, encoding, _documents(document, documents_path, max_text_bytes))


def _documents(document: Any, path: TextPath, max_text_bytes: int) -> tuple[str, ...]:
    field = ".".join(path)
    node = _walk(document, path)
    if not isinstance(node, list) or not all(isinstance(d, str) and d for d in node):
        raise ExtractError(f"field {field} is {_kind(node)}, not a list of non-empty strings")
    if not 1 <= len(node) <= MAX_DOCUMENTS:
        raise ExtractError(f"field {field} has {len(node)} documents; 1 to {MAX_DOCUMENTS}")
    _checked("".join(node), f"field {field}", max_text_bytes)
    return tuple(node)


def _walk(document: Any, path: TextPath) -> Any:
    """The node at ``path`` (map keys, list indexes); raises ``ExtractError`` naming where."""
    field = ".".join(path)
    node: Any = document
    for depth, name in enumerate(path):
        where = ".".join(path[:depth]) or "the value"
        if isinstance(node, dict):
            if name in node:
                node = node[name]
            elif name.encode() in node:  # msgpack maps may have binary keys
                node = node[name.encode()]
            else:
                raise ExtractError(f"field {field}: {where} has no {name!r}")
        elif isinstance(node, list):
            if not name.isdigit() or int(name) >= len(node):
                raise ExtractError(
                    f"field {field}: {where} is a list of {len(node)}; {name!r} is not an index"
                )
            node = node[int(name)]
        else:
            raise ExtractError(f"field {field}: {where} is {_kind(node)}, not a map")
    return node


def output_record(
    *,
    topic: str,
    key: bytes | None,
    value: bytes,
    encoding: Encoding,
    status: str,
    source_topic: str,
    source_partition: int,
    source_offset: int,
) -> OutRecord:
    """The output record of one scored source record.

    Keyed by the source key (the producer's partitioner picks the partition from it); headers
    ``content-type``, ``kbatch-status`` and ``kbatch.source.topic`` / ``.partition`` /
    ``.offset`` (UTF-8, decimal — the names dead letters use), so a reader can join the output
    back to its source record.
    """
    return OutRecord(
        topic=topic,
        partition=None,
        key=key,
        value=value,
        headers=[
            (h.CONTENT_TYPE, encoding.value.encode("ascii")),
            (h.STATUS, status.encode("ascii")),
            (h.SOURCE_TOPIC, source_topic.encode("utf-8")),
            (h.SOURCE_PARTITION, str(int(source_partition)).encode("ascii")),
            (h.SOURCE_OFFSET, str(int(source_offset)).encode("ascii")),
        ],
    )


# ---- internals ---------------------------------------------------------------------------------


def _checked(text: str, what: str, max_text_bytes: int) -> str:
    if not text:
        raise ExtractError(f"{what} is an empty string")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as err:
        raise ExtractError(f"{what} holds a lone surrogate (character {err.start})") from None
    if size > max_text_bytes:
        raise ExtractError(
            f"{what} is {size} bytes of UTF-8; at most {max_text_bytes} are accepted"
        )
    return text


def _encoding(
    value: bytes, headers: Sequence[tuple[str, bytes | None]], value_format: ValueFormat
) -> Encoding:
    if value_format == "json":
        return Encoding.JSON
    if value_format == "msgpack":
        return Encoding.MSGPACK
    content_type = h.last_value(headers, h.CONTENT_TYPE)
    if content_type is not None:
        try:
            return Encoding.from_content_type(content_type)
        except DecodeError:
            pass  # an application's own media type: look at the bytes
    first = value.lstrip(_WHITESPACE)[:1]
    return Encoding.JSON if first and first[0] in _JSON_START else Encoding.MSGPACK


def _text_field_hint(value: bytes) -> str:
    """For a value that is not text: when it is a msgpack map, what ``--text-field`` would
    read (its first keys); else "". A serve request topic holds such values."""
    try:
        document = msgpack.unpackb(value, raw=False, strict_map_key=False)
    except Exception:  # msgpack raises several unrelated types for bad input
        return ""
    if not isinstance(document, dict) or not document:
        return ""
    keys = [k for k in document if isinstance(k, str) and len(k) <= 40][:8]  # names, not data
    if not keys:
        return ""
    example = next((k for k in keys if isinstance(document[k], str)), None)
    named = f", e.g. --text-field {example}" if example is not None else ""
    return f"; it is a msgpack map (keys {', '.join(keys)}): --text-field names the text{named}"


def _decode(value: bytes, encoding: Encoding) -> Any:
    """The parsed value. An error names what is wrong and where, never the value's bytes."""
    if encoding is Encoding.JSON:
        try:
            return json.loads(value)
        except json.JSONDecodeError as err:
            where = f"{err.msg} at line {err.lineno} column {err.colno}"
            raise ExtractError(f"the value is not valid JSON: {where}") from None
        except UnicodeDecodeError as err:
            where = f"not UTF-8 (byte {err.start})"
            raise ExtractError(f"the value is not valid JSON: {where}") from None
        except RecursionError:
            raise ExtractError("the value is not valid JSON: nested too deep") from None
        except ValueError as err:
            raise ExtractError(f"the value is not valid JSON: {type(err).__name__}") from None
    try:
        return msgpack.unpackb(value, raw=False, strict_map_key=False)
    except msgpack.ExtraData as err:
        reason = f"{len(err.extra)} bytes follow the first object"  # type: ignore[attr-defined]
    except ValueError as err:  # "Unpack failed: incomplete input", FormatError, StackError
        incomplete = "incomplete" in str(err)
        reason = "empty" if not value else "cut short" if incomplete else "malformed"
    except Exception as err:  # msgpack raises several unrelated types for bad input
        reason = type(err).__name__
    raise ExtractError(f"the value is not valid msgpack: {reason}{_not_msgpack_hint(value)}")


def _not_msgpack_hint(value: bytes) -> str:
    """What a value that is not msgpack looks like instead, for its error ("" if nothing)."""
    if value.lstrip()[:1] in (b"{", b"["):
        return " (it starts like JSON: --value-format json)"
    if reads_as_text(value):
        return (
            " (it reads as plain text, not a map: without --text-field the whole value is the text)"
        )
    return ""


_KINDS: tuple[tuple[type | types.UnionType, str], ...] = (
    (type(None), "null"),
    (bool, "a boolean"),  # before int: a bool is an int
    (int | float, "a number"),
    (bytes, "binary"),
    (str, "a string"),
    (list, "a list"),
    (dict, "a map"),
)


def _kind(node: object) -> str:
    return next((name for t, name in _KINDS if isinstance(node, t)), f"a {type(node).__name__}")
