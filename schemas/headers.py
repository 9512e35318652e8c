"""Kafka header names of the wire contract (CONTRACT.md: request, reply and dead-letter records).

Header names are case-sensitive byte-exact strings. The four request headers are Spring Kafka's
(``KafkaHeaders.REPLY_TOPIC``, ``REPLY_PARTITION``, ``CORRELATION_ID``), so a Spring
``ReplyingKafkaTemplate`` works unchanged.

Lookup rule (one rule, two functions: :func:`last_value` for one name, :func:`last_values` for
all names in one pass): when a record carries the same header name more than once, the last one
wins, as in Java's ``Headers.lastHeader``; a null value (Kafka allows them) counts as no header,
so ``[(n, b"x"), (n, None)]`` has no ``n``. A client or a consumer reading headers uses these.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

HeaderList = Iterable[tuple[str, bytes | None]]
"""A record's headers in order: ``(name, value)``; a name may repeat, a value may be null."""

# Request headers (all optional).
REPLY_TOPIC: Final = "kafka_replyTopic"
"""UTF-8 topic name the reply goes to; absent: the configured reply topic."""

REPLY_PARTITION: Final = "kafka_replyPartition"
"""Reply partition as exactly 4 bytes, big-endian signed int (Java ``int``); absent: by key."""

CORRELATION_ID: Final = "kafka_correlationId"
"""Opaque bytes (Spring sends 16), echoed verbatim on the reply."""

CONTENT_TYPE: Final = "content-type"
"""Encoding of the value: ``application/msgpack`` (default) or ``application/json``."""

# Reply headers (besides CORRELATION_ID and CONTENT_TYPE).
STATUS: Final = "kbatch-status"
"""The reply's status as ASCII: ``ok``, ``error`` or ``expired``."""

# Dead-letter headers, added to the original record's headers; values are UTF-8 strings.
ERROR_CODE: Final = "kbatch.error.code"
ERROR_MESSAGE: Final = "kbatch.error.message"
SOURCE_TOPIC: Final = "kbatch.source.topic"
SOURCE_PARTITION: Final = "kbatch.source.partition"
SOURCE_OFFSET: Final = "kbatch.source.offset"
ORIGINAL_VALUE_BYTES: Final = "kbatch.dlq.original-value-bytes"
"""Only on a dead letter whose value had to be cut to fit the dead-letter topic: the original
value's length in bytes (decimal); the value is then its first bytes."""

REPLY_PARTITION_BYTES: Final = 4
"""Exact length of a ``kafka_replyPartition`` value (a Java int, big-endian)."""


def last_value(headers: HeaderList, name: str) -> bytes | None:
    """The value of the last header called ``name``; None when there is none or its value is
    null (the module's lookup rule)."""
    found: bytes | None = None
    for key, value in headers:
        if key == name:
            found = value
    return None if found is None else bytes(found)


def last_values(headers: HeaderList) -> dict[str, bytes]:
    """Every name's :func:`last_value`, in one pass; names whose last value is null are left out
    (the module's lookup rule)."""
    found: dict[str, bytes] = {}
    for key, value in headers:
        if value is None:
            found.pop(key, None)
        else:
            found[key] = bytes(value)
    return found


__all__ = [
    "CONTENT_TYPE",
    "CORRELATION_ID",
    "ERROR_CODE",
    "ERROR_MESSAGE",
    "ORIGINAL_VALUE_BYTES",
    "REPLY_PARTITION",
    "REPLY_PARTITION_BYTES",
    "REPLY_TOPIC",
    "SOURCE_OFFSET",
    "SOURCE_PARTITION",
    "SOURCE_TOPIC",
    "STATUS",
    "HeaderList",
    "last_value",
    "last_values",
]
