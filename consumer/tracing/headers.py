"""W3C Trace Context headers on Kafka records: read a request's, write a reply's (pure, no
OpenTelemetry import).

Rules (CONTRACT.md §Trace headers; the W3C Trace Context recommendation, level 1, §3):

* ``traceparent`` is ``VERSION-TRACE_ID-PARENT_ID-FLAGS`` in lowercase hex: version ``00`` is
  exactly 55 characters; a later version (not ``ff``) may append ``-…`` fields, which are
  ignored. An all-zero trace id or parent id is invalid.
* A header that cannot be used is ignored, never an error: the request is served as if it had
  none, and the reason is counted (``kbatch_trace_headers_ignored_total{reason}``):
  ``repeated`` (more than one ``traceparent``: which one the sender meant is unknown, as for
  HTTP in the recommendation §3.2), ``oversized`` (a ``traceparent`` over
  :data:`MAX_TRACEPARENT_BYTES`, or a ``tracestate`` over :data:`MAX_TRACESTATE_BYTES`: only the
  ``tracestate`` is dropped then), ``encoding`` (not ASCII) and ``invalid`` (anything else).
* Several ``tracestate`` headers are joined with commas in order (the recommendation §3.3.1.1
  allows a list to be split); a null header value counts as no header (CONTRACT.md's lookup
  rule).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "MAX_TRACEPARENT_BYTES",
    "MAX_TRACESTATE_BYTES",
    "MAX_TRACESTATE_MEMBERS",
    "TRACEPARENT",
    "TRACESTATE",
    "IgnoredReason",
    "TraceParent",
    "format_traceparent",
    "read_trace_headers",
]

TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"

MAX_TRACEPARENT_BYTES: Final = 256
"""A longer ``traceparent`` is ignored unread (version 00 is 55 bytes; later versions may add
fields, not kilobytes)."""

MAX_TRACESTATE_BYTES: Final = 512
"""A longer ``tracestate`` (all its headers joined) is dropped: the recommendation asks
vendors to propagate at least 512 characters (§3.3.1.5), and kbatch keeps no more."""

MAX_TRACESTATE_MEMBERS: Final = 32
"""A ``tracestate`` of more list members is invalid (the recommendation §3.3.1.1)."""

IgnoredReason = Literal["repeated", "oversized", "encoding", "invalid"]

_TRACEPARENT_RE: Final = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")

_TRACESTATE_MEMBER_RE: Final = re.compile(
    r"([a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13})"
    r"=([\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e])"
)
"""A ``tracestate`` list member, ``key=value`` (the recommendation §3.3.1.3; the same
grammar as OpenTelemetry's ``TraceState``)."""


@dataclass(frozen=True, slots=True)
class TraceParent:
    """A request's trace context: ``trace_id`` (128-bit), ``span_id`` (the sender's span,
    64-bit), ``flags`` (bit 0: sampled) and ``tracestate`` (the vendor list as sent, or
    None)."""

    trace_id: int
    span_id: int
    flags: int
    tracestate: str | None = None

    @property
    def sampled(self) -> bool:
        return bool(self.flags & 0x01)


def read_trace_headers(
    headers: Iterable[tuple[str, bytes | None]],
    ignored: Callable[[IgnoredReason], None],
) -> TraceParent | None:
    """The trace context of a record with ``headers``, or None when it has no usable one.

    ``ignored(reason)`` is called once for each header ignored (module docstring's rules);
    nothing here raises for bad input.
    """
    parents: list[bytes] = []
    states: list[bytes] = []
    for name, value in headers:
        if value is None:
            continue
        if name == TRACEPARENT:
            parents.append(value)
        elif name == TRACESTATE:
            states.append(value)
    if not parents:
        return None
    if len(parents) > 1:
        ignored("repeated")
        return None
    parent = _parse_traceparent(parents[0], ignored)
    if parent is None or not states:
        return parent
    state = _join_tracestate(states, ignored)
    if state is None:
        return parent
    return TraceParent(parent.trace_id, parent.span_id, parent.flags, state)


def _parse_traceparent(raw: bytes, ignored: Callable[[IgnoredReason], None]) -> TraceParent | None:
    if len(raw) > MAX_TRACEPARENT_BYTES:
        ignored("oversized")
        return None
    try:
        text = bytes(raw).decode("ascii")
    except UnicodeDecodeError:
        ignored("encoding")
        return None
    match = _TRACEPARENT_RE.match(text)
    if match is None:
        ignored("invalid")
        return None
    version, trace_hex, span_hex, flags_hex = match.groups()
    rest = text[match.end() :]
    if version == "ff" or (version == "00" and rest) or (rest and not rest.startswith("-")):
        ignored("invalid")
        return None
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if trace_id == 0 or span_id == 0:
        ignored("invalid")
        return None
    return TraceParent(trace_id, span_id, int(flags_hex, 16))


def _join_tracestate(states: list[bytes], ignored: Callable[[IgnoredReason], None]) -> str | None:
    size = sum(len(s) for s in states) + len(states) - 1
    if size > MAX_TRACESTATE_BYTES:
        ignored("oversized")
        return None
    try:
        joined = ",".join(bytes(s).decode("ascii") for s in states)
    except UnicodeDecodeError:
        ignored("encoding")
        return None
    members = _tracestate_members(joined)
    if members is None:
        ignored("invalid")
        return None
    return ",".join(members) or None


def _tracestate_members(joined: str) -> list[str] | None:
    """The ``key=value`` members of a ``tracestate`` list, or None when it is invalid (module
    docstring)."""
    members: list[str] = []
    keys: set[str] = set()
    for part in joined.split(","):
        member = part.strip(" \t")
        if not member:
            continue
        match = _TRACESTATE_MEMBER_RE.fullmatch(member)
        if match is None or match.group(1) in keys or len(members) == MAX_TRACESTATE_MEMBERS:
            return None
        keys.add(match.group(1))
        members.append(member)
    return members


def format_traceparent(trace_id: int, span_id: int, flags: int) -> bytes:
    """The version-00 ``traceparent`` value of a span (55 ASCII bytes)."""
    return f"00-{trace_id:032x}-{span_id:016x}-{flags & 0xFF:02x}".encode("ascii")
