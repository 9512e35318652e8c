"""The timings both clients' reply sinks share, pure (no Kafka client):
:mod:`consumer.kafka.sink` and :mod:`consumer.kafka.topic_operations` on aiokafka,
:mod:`consumer.kafka.confluent_adapter.sink` and ``.write_verdicts`` on librdkafka."""

from __future__ import annotations

__all__ = ["LATE_LOG_EVERY_S", "MISSING_TOPIC_GRACE_S", "VERDICT_TTL_S"]

MISSING_TOPIC_GRACE_S = 2.0
"""How long the broker is asked again about a topic it does not know before a record for it is
refused (a topic a client created a moment ago may take that long to reach every broker's
metadata). aiokafka's own wait for a topic's metadata is the whole ``send_timeout_ms`` (30 s by
default), during which the record's partition could not commit; librdkafka's is
``topic.metadata.propagation.max.ms``."""

LATE_LOG_EVERY_S = 10.0
"""At most one warning per this many seconds about records not acknowledged in time (a broker
that stalls makes every send call late)."""

VERDICT_TTL_S = 10.0
"""How long a topic's write verdict (may kbatch write to it?) is kept before the broker is
asked again (an ACL granted or revoked meanwhile is seen within this time; a WRITE revoked
before then aborts one transaction, which serve recovers from)."""
