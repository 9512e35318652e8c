"""Kafka header names of the wire contract (CONTRACT.md: request, reply and dead-letter records).

Header names are case-sensitive byte-exact strings. The four request headers are Spring Kafka's
(``KafkaHeaders.REPLY_TOPIC``, ``REPLY_PARTITION``, ``CORRELATION_ID``), so a Spring
``ReplyingKafkaTemplate`` works unchanged. When a record carries the same header name more than
once, the last one wins, as in Java's ``Headers.lastHeader``.
"""

from __future__ import annotations

from typing import Final

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
]
