"""The completed offsets above a committed offset, as commit metadata text (format ``kb1``).

Pure: no aiokafka, no I/O. Batching by token length finishes records out of order, so a
partition's committed offset waits for its oldest unfinished record while later ones are
answered. Each commit therefore also carries, in the commit's metadata string, which offsets
*above* the committed one are finished; after a crash the next owner reads it back and skips
them (CONTRACT.md §Delivery). The idea and the pick-the-smaller-encoding rule come from
Confluent's Parallel Consumer (``OffsetMapCodecManager``: run-length and bitset encodings).

Format, version 1 (all text is ASCII, so its length in characters is its size in bytes)::

    kb1:<base64 (RFC 4648, padded) of: kind byte · varint base · body>

* ``base``: the committed offset the set is relative to. A reader whose committed offset is
  not ``base`` (the offsets were reset, or another tool committed) ignores the set.
* kind ``0`` (run-length): varints ``n0, d0, n1, d1, …`` — ``n0`` offsets from ``base`` not
  done, then ``d0`` done, and so on; the last run is a done run.
* kind ``1`` (bitmap): bit ``i`` (byte ``i // 8``, bit ``i % 8``, least significant first)
  set when offset ``base + i`` is done; trailing zero bytes are left out.
* Varints are unsigned LEB128 (7 bits a byte, least significant group first).

The encoder writes whichever body is shorter. The broker refuses a commit whose metadata is
longer than its ``offset.metadata.max.bytes`` (4 KiB by default, :data:`MAX_METADATA_BYTES`);
when the set does not fit, the lowest done offsets that fit are kept (the rest are recomputed
after a crash, as before this format) and the result says it was truncated. No done offset
above ``base`` is written as ``""`` (an empty metadata string).

Reading is tolerant: an empty string means none; anything else that is not a well-formed
``kb1`` text (another tool's metadata, a newer version, corruption) is ignored with a warning.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Iterable
from dataclasses import dataclass

log = logging.getLogger(__name__)

__all__ = [
    "MAX_METADATA_BYTES",
    "PREFIX",
    "Encoded",
    "MetadataError",
    "decode_completed",
    "encode_completed",
    "read_completed",
]

PREFIX = "kb1:"
"""Names the format and its version; another prefix is not this format."""

MAX_METADATA_BYTES = 4096
"""The broker's default ``offset.metadata.max.bytes`` (Kafka broker configuration): the
longest metadata string a commit may carry."""

_RUN_LENGTH, _BITMAP = 0, 1


class MetadataError(ValueError):
    """A metadata string is not a well-formed ``kb1`` text."""


@dataclass(frozen=True, slots=True)
class Encoded:
    """One partition's commit metadata.

    Attributes:
        text: the metadata string ("" when no done offset above the base was written).
        kept: how many of the done offsets it holds (the lowest ones).
        truncated: True when some done offsets did not fit and were left out.
    """

    text: str
    kept: int
    truncated: bool


def _varint(value: int, out: bytearray) -> None:
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise MetadataError("a varint runs past the end")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise MetadataError("a varint is longer than 64 bits")


def _run_lengths(relative: list[int]) -> bytes:
    """Runs of not-done/done from relative offset 0; ``relative`` sorted, unique, >= 1."""
    out = bytearray()
    at = 0  # next relative offset not yet covered by a run
    i = 0
    while i < len(relative):
        start = relative[i]
        j = i
        while j + 1 < len(relative) and relative[j + 1] == relative[j] + 1:
            j += 1
        _varint(start - at, out)
        _varint(j - i + 1, out)
        at = relative[j] + 1
        i = j + 1
    return bytes(out)


def _bitmap(relative: list[int]) -> bytes:
    out = bytearray(relative[-1] // 8 + 1) if relative else bytearray()
    for r in relative:
        out[r >> 3] |= 1 << (r & 7)
    return bytes(out)


def _text(kind: int, base: int, body: bytes) -> str:
    head = bytearray([kind])
    _varint(base, head)
    return PREFIX + base64.b64encode(bytes(head) + body).decode("ascii")


def _encode_all(base: int, relative: list[int]) -> str:
    if not relative:
        return ""
    runs, bitmap = _run_lengths(relative), _bitmap(relative)
    kind, body = (_RUN_LENGTH, runs) if len(runs) <= len(bitmap) else (_BITMAP, bitmap)
    return _text(kind, base, body)


def encode_completed(
    base: int, done: Iterable[int], max_bytes: int = MAX_METADATA_BYTES
) -> Encoded:
    """Encode the offsets in ``done`` above ``base`` (the committed offset) as metadata text.

    Offsets at or below ``base`` are left out (the commit covers them already). When the whole
    set does not fit in ``max_bytes`` characters, the longest prefix of the sorted offsets that
    fits is kept (binary search: both encodings grow with the prefix).

    Args:
        base: the committed offset (next offset to read), >= 0.
        done: finished offsets, any order, duplicates allowed.
        max_bytes: the longest text allowed (the broker's ``offset.metadata.max.bytes``).

    Raises:
        ValueError: ``base`` is negative.
    """
    if base < 0:
        raise ValueError(f"base offset must be >= 0, got {base}")
    relative = sorted({o - base for o in done if o > base})
    text = _encode_all(base, relative)
    if len(text) <= max_bytes:
        return Encoded(text, len(relative), truncated=False)
    low, high = 0, len(relative) - 1  # the longest fitting prefix has a length in [low, high]
    while low < high:
        mid = (low + high + 1) // 2
        if len(_encode_all(base, relative[:mid])) <= max_bytes:
            low = mid
        else:
            high = mid - 1
    return Encoded(_encode_all(base, relative[:low]), low, truncated=True)


def decode_completed(text: str) -> tuple[int, frozenset[int]]:
    """The base offset and the done offsets (absolute) of a ``kb1`` text. One trailing NUL
    byte is ignored: confluent-kafka commits a metadata string with its C terminator, and
    other readers (aiokafka, Java's admin client) return it.

    Raises:
        MetadataError: ``text`` is not a well-formed ``kb1`` text (wrong prefix, bad base64,
            unknown kind, truncated varints, an empty run).
    """
    text = text.removesuffix("\x00")
    if not text.startswith(PREFIX):
        raise MetadataError(f"not {PREFIX!r} metadata")
    try:
        data = base64.b64decode(text[len(PREFIX) :], validate=True)
    except (binascii.Error, ValueError) as err:
        raise MetadataError(f"bad base64: {err}") from None
    if not data:
        raise MetadataError("empty payload")
    kind = data[0]
    base, pos = _read_varint(data, 1)
    done: set[int] = set()
    if kind == _RUN_LENGTH:
        at = base
        while pos < len(data):
            gap, pos = _read_varint(data, pos)
            run, pos = _read_varint(data, pos)
            if run == 0 or gap == 0:
                raise MetadataError("an empty run (the base offset itself is never done)")
            at += gap
            done.update(range(at, at + run))
            at += run
    elif kind == _BITMAP:
        body = data[pos:]
        if body[:1] and body[0] & 1:
            raise MetadataError("the base offset itself is marked done")
        for i, byte in enumerate(body):
            done.update(base + 8 * i + b for b in range(8) if byte >> b & 1)
    else:
        raise MetadataError(f"unknown encoding kind {kind}")
    return base, frozenset(done)


def read_completed(committed: int, text: str | None, where: object = "") -> frozenset[int]:
    """The done offsets above ``committed`` that ``text`` records; empty when there are none
    or the text cannot be used. Never raises.

    A text that is not well-formed ``kb1``, or whose base is not ``committed`` (the offsets
    were moved by someone else since), is ignored with a warning naming ``where`` (e.g. the
    partition).
    """
    if not text:
        return frozenset()
    try:
        base, done = decode_completed(text)
    except MetadataError as err:
        log.warning("commit metadata of %s ignored (%s): %.60r", where, err, text)
        return frozenset()
    if base != committed:
        log.warning(
            "commit metadata of %s ignored: written for offset %d, committed offset is %d",
            where,
            base,
            committed,
        )
        return frozenset()
    return done
