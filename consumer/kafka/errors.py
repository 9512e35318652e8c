"""The errors of the Kafka layer (``consumer.kafka``): one tree, a ``retriable`` flag each.

::

    KafkaLayerError                 base of what consumer.kafka raises (a RuntimeError)
     ├── KafkaUnavailableError      no broker answered (start-up, admin calls); retriable
     │    └── KafkaSecurityError    the broker answered but refused: TLS check, SASL login,
     │                              an ACL denial of the group or a topic, an unreadable
     │                              CA/key/password file; not retriable (one line, exit 1)
     ├── TopicCreationError         missing topics the broker refused to create (ACLs,
     │    │                         replication factor, a policy); not retriable
     │    └── TopicMissingError     --no-create-topics and a topic kbatch writes to is
     │                              missing (serve's start: exit 1); not retriable
     ├── CommitError                a commit was refused (rebalance in progress, partition
     │                              moved); retriable at the next commit interval
     ├── DeliveryError              a record that can never be delivered (bad topic or
     │    │                         partition, too large); not retriable: dead-letter it
     │    ├── DeliveryDeniedError   the broker's ACLs refuse writing to the topic
     │    │                         (TOPIC_AUTHORIZATION_FAILED): reply_topic_not_allowed
     │    └── DeliveryTopicMissingError  the topic does not exist (not even after a grace)
     ├── SinkClosedError            the sink closed before the record was acknowledged;
     │                              not retriable here (the record is re-read after a restart)
     ├── TransactionError           --exactly-once: a partition's transaction aborted, without
     │                              a verdict, or its producer fenced; serve recomputes the
     │                              partition from its commit (fenced: the command stops)
     ├── FencedInstanceError        another member joined under this --group-instance-id; not
     │                              retriable (the command stops)
     ├── RangeSourceError           backfill's source: topic missing, broker down, offsets not
     │                              available; not retriable within the job
     └── RangeSpecError             a --from/--to value that cannot be parsed or does not fit
                                    the topic (also a ValueError); not retriable

``retriable`` means "the same operation may succeed if tried again later", as in
``schemas.errors`` and ``consumer.model.errors``.

This module imports no Kafka client: each adapter translates its client's errors at the
layer edge (httpx's ``map_httpcore_exceptions``: one place, the most specific own class,
chained with ``from``): aiokafka's by :func:`consumer.kafka.aiokafka_errors.map_kafka_errors`,
librdkafka's by :func:`consumer.kafka.confluent_adapter.errors.map_confluent_errors`. None of
them leaves an adapter's public method except the aiokafka sink's, whose retry loop reads
aiokafka's own ``retriable`` flag before settling on :class:`DeliveryError` or
:class:`SinkClosedError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

__all__ = [
    "FENCED",
    "CommitError",
    "DeliveryDeniedError",
    "DeliveryError",
    "DeliveryTopicMissingError",
    "FencedInstanceError",
    "KafkaLayerError",
    "KafkaSecurityError",
    "KafkaUnavailableError",
    "RangeSourceError",
    "RangeSpecError",
    "SinkClosedError",
    "TopicCreationError",
    "TopicMissingError",
    "TransactionError",
]


class KafkaLayerError(RuntimeError):
    """Base of every error the Kafka layer raises."""

    retriable: ClassVar[bool] = False


class KafkaUnavailableError(KafkaLayerError):
    """No broker answered (wrong ``--bootstrap``, broker down, TLS/SASL mismatch)."""

    retriable: ClassVar[bool] = True


class KafkaSecurityError(KafkaUnavailableError):
    """The broker answered but refused this client: a failed TLS check (untrusted CA, wrong
    host name, expired certificate), a failed SASL login, an ACL denial of the consumer group
    or a topic, or a CA/key/password/token file that cannot be read. Not retriable: the same
    settings fail again. A subclass of :class:`KafkaUnavailableError`, so every start-up path
    reports it as one line and exits 1. Messages name the cause, never a secret."""

    retriable: ClassVar[bool] = False


class TopicCreationError(KafkaLayerError):
    """Topics are missing and the broker refused to create them (no CREATE permission, a
    replication factor above the broker count, a policy); the message names them and says
    what to do. Brokers without ``auto.create.topics.enable`` never create them on first use."""


class TopicMissingError(TopicCreationError):
    """``--no-create-topics`` and a topic kbatch writes to is missing: the message names them
    and says what to do (create them, then start)."""


class CommitError(KafkaLayerError):
    """A commit was refused (typically a rebalance in progress); retriable at the next interval."""

    retriable: ClassVar[bool] = True


class DeliveryError(KafkaLayerError):
    """A record cannot be delivered whatever the retries (not retriable)."""


class DeliveryDeniedError(DeliveryError):
    """The broker's ACLs refuse this principal writing to the record's topic."""


class DeliveryTopicMissingError(DeliveryError):
    """The record's topic does not exist (the sink waited ``MISSING_TOPIC_GRACE_S`` for it)."""


class SinkClosedError(KafkaLayerError):
    """The sink was closed while a send was still being retried."""


FENCED = "fenced"
"""The :attr:`TransactionError.failed` reason of a producer fenced by a newer one under its
transactional id (another member owns the partition now): not recoverable in this process."""


class TransactionError(KafkaLayerError):
    """``--exactly-once``: a partition's transaction could not be committed (aborted, without
    a verdict, or its producer fenced by a newer owner of the partition). Its producer is
    closed; its replies never become visible to ``read_committed`` readers unless the
    transaction committed after all, and then its committed offsets say so.

    Attributes:
        committed: the offsets of the other partitions that were committed in the same call.
        failed: each failed partition's reason: ``unknown_outcome`` (no verdict on the commit
            within ``--send-timeout-ms``), ``unacknowledged_send`` (a send of the transaction
            got no verdict), ``aborted`` (the broker refused it), or :data:`FENCED`. Every
            reason but :data:`FENCED` is recoverable: serve replaces the producer and computes
            the partition again from its committed offset (Kafka Streams' corrupted task;
            :meth:`consumer.serve.rebalance.Rebalancer.commit`); a fenced one stops the command.
    """

    def __init__(
        self,
        message: str,
        committed: dict[tuple[str, int], int] | None = None,
        failed: dict[tuple[str, int], str] | None = None,
    ) -> None:
        super().__init__(message)
        self.committed = committed or {}
        self.failed = failed or {}

    @classmethod
    def not_committed(
        cls,
        errors: Mapping[tuple[str, int], BaseException],
        committed: dict[tuple[str, int], int],
        reasons: dict[tuple[str, int], str],
    ) -> TransactionError:
        """The error of one commit call whose partitions in ``errors`` failed (each with its
        client's error, named in the message); ``committed`` the others."""
        return cls(
            f"transaction of {sorted(errors)} not committed: "
            + "; ".join(f"{tp}: {err!r}" for tp, err in errors.items()),
            committed,
            reasons,
        )

    @property
    def recoverable(self) -> bool:
        """True when partitions failed and none of them was fenced."""
        return bool(self.failed) and FENCED not in self.failed.values()


class FencedInstanceError(KafkaLayerError):
    """Another member of the group uses this member's ``--group-instance-id`` and took its
    place (KIP-345 fencing, :mod:`consumer.kafka.static_fence`); the command stops."""


class RangeSourceError(KafkaLayerError):
    """The broker could not be asked (topic missing, broker down, offsets not available)."""


class RangeSpecError(KafkaLayerError, ValueError):
    """A ``--from``/``--to`` value that cannot be parsed or does not fit the topic."""


class JobsTopicError(KafkaLayerError):
    """The jobs topic cannot be created, read or written (docs/JOBS.md)."""
