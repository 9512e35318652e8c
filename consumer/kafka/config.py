"""The Kafka layer's settings groups, each defined once: the adapters take these, never a
command's whole settings.

==========================  ====================================  =================================
group                       fields                                taken by
==========================  ====================================  =================================
:class:`KafkaClientSettings`  bootstrap, security (SASL, TLS)     every client: source, sink,
                                                                  range source, admin calls
:class:`ConsumerGroupSettings`  static membership, offset reset,  :class:`~consumer.kafka.source.
                              the group protocol's timeouts       KafkaSource` (``kbatch serve``)
:class:`PollSettings`       records and wait of one fetch          the pipeline, backfill's job
:class:`SinkSettings`       deadline of one send attempt          :class:`~consumer.kafka.sink.
                                                                  KafkaSink`
==========================  ====================================  =================================

The commands' settings (``consumer.config.ServeSettings``, ``consumer.backfill.config.
BackfillSettings``) inherit the groups they expose, so every field is a flag
(``--session-timeout-ms``), a ``KBATCH_*`` variable and a YAML key under the same name; the
wiring hands each adapter its group (``consumer.config.project``). Pure pydantic: no aiokafka
here (:mod:`consumer.kafka.client_config` turns a group into aiokafka keyword arguments).

Errors raised: :class:`pydantic.ValidationError` for a value out of bounds or a combination
that cannot work (the message names both values).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

__all__ = ["ConsumerGroupSettings", "KafkaClientSettings", "PollSettings", "SinkSettings"]

_GROUP = ConfigDict(frozen=True, extra="forbid")


KafkaClientName = Literal["aiokafka", "confluent"]
"""The Kafka client under the seam (:mod:`consumer.kafka.transport`): ``aiokafka`` (pure
Python on asyncio) or ``confluent`` (confluent-kafka on librdkafka, C threads)."""

GroupProtocol = Literal["classic", "consumer"]
"""The consumer group protocol: ``classic`` (JoinGroup/SyncGroup, eager revocation) or
``consumer`` (KIP-848: the broker assigns incrementally; confluent-kafka only)."""


class KafkaClientSettings(BaseModel):
    """Where the brokers are and how to reach them: TLS, SASL, mutual TLS (docs/SECURITY.md).

    Secrets (``sasl_password``) are never a flag: they come from ``KBATCH_SASL_PASSWORD``, the
    YAML file or a file named by ``sasl_password_file``; they print as ``**********``.
    """

    model_config = _GROUP

    bootstrap: str = Field(
        "127.0.0.1:9092", description="Kafka bootstrap servers, comma-separated."
    )
    kafka_client: KafkaClientName = Field(
        "aiokafka",
        description="The Kafka client: aiokafka (pure Python on asyncio) or confluent "
        "(confluent-kafka on librdkafka: less CPU per record; the kbatch[serve] extra). "
        "The wire is the same: key → partition, headers, offsets and their metadata.",
    )
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT",
        description="Kafka security.protocol: SSL for TLS (mutual TLS with --ssl-certfile), "
        "SASL_SSL for a user and password over TLS.",
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] | None = (
        Field(None, description="Kafka sasl.mechanism (SASL_* protocols).")
    )
    sasl_username: str | None = Field(None, description="SASL user (PLAIN, SCRAM).")
    sasl_password: SecretStr | None = Field(
        None,
        description="SASL password (PLAIN, SCRAM): env KBATCH_SASL_PASSWORD or the YAML "
        "file only, never a flag; never logged.",
    )
    sasl_password_file: Path | None = Field(
        None, description="File holding the SASL password (read at start; trailing newline cut)."
    )
    sasl_oauth_token_file: Path | None = Field(
        None,
        description="OAUTHBEARER: file holding the bearer token, read again at each login "
        "(a sidecar may refresh it).",
    )
    ssl_cafile: Path | None = Field(
        None, description="CA bundle (PEM) the broker's certificate is checked against."
    )
    ssl_certfile: Path | None = Field(None, description="Client certificate (PEM) for mutual TLS.")
    ssl_keyfile: Path | None = Field(None, description="Client private key (PEM) for mutual TLS.")
    ssl_check_hostname: bool = Field(
        True, description="Check that the broker's certificate names the host connected to."
    )

    @model_validator(mode="after")
    def _check_security(self) -> Self:
        sasl = self.security_protocol.startswith("SASL_")
        if sasl and self.sasl_mechanism is None:
            raise ValueError(f"security_protocol={self.security_protocol} needs a sasl_mechanism")
        if self.sasl_mechanism == "OAUTHBEARER" and self.sasl_oauth_token_file is None:
            raise ValueError("sasl_mechanism=OAUTHBEARER needs sasl_oauth_token_file")
        if self.sasl_mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512") and sasl:
            if self.sasl_username is None:
                raise ValueError(f"sasl_mechanism={self.sasl_mechanism} needs sasl_username")
            if self.sasl_password is None and self.sasl_password_file is None:
                raise ValueError(
                    f"sasl_mechanism={self.sasl_mechanism} needs a password: "
                    "KBATCH_SASL_PASSWORD or sasl_password_file"
                )
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("mutual TLS needs both ssl_certfile and ssl_keyfile")
        return self

    def password(self) -> str | None:
        """The SASL password: ``sasl_password``, else the content of ``sasl_password_file``
        (trailing newline cut), else None.

        Raises:
            OSError: ``sasl_password_file`` cannot be read (the message names the file only).
        """
        if self.sasl_password is not None:
            return self.sasl_password.get_secret_value()
        if self.sasl_password_file is not None:
            return self.sasl_password_file.read_text(encoding="utf-8").rstrip("\r\n")
        return None


class ConsumerGroupSettings(BaseModel):
    """How a consumer-group member behaves (KIP-62 heartbeats, KIP-345 static membership)."""

    model_config = _GROUP

    group_instance_id: str | None = Field(
        None,
        description="Static membership id (KIP-345): a restart within the session timeout "
        "keeps the assignment. --replicas N: replica i gets <id>-i, and without an id "
        "<hostname>-<group>-i.",
    )
    leave_group_on_shutdown: bool = Field(
        False,
        description="A static member (--group-instance-id) leaves the group when it stops "
        "(SIGTERM, SIGINT): its partitions move at once, not after the session timeout. For "
        "ids that never come back (a Deployment's pod names, a scale-down); off where the "
        "same id restarts (a StatefulSet). Dynamic members always leave.",
    )
    group_protocol: GroupProtocol = Field(
        "classic",
        description="The group protocol: classic (JoinGroup/SyncGroup; every broker) or "
        "consumer (KIP-848: the broker assigns and moves only the partitions that move; Kafka "
        "4.0+, --kafka-client confluent; the broker's group.consumer.* settings then replace "
        "--session-timeout-ms and --heartbeat-interval-ms).",
    )
    auto_offset_reset: Literal["earliest", "latest"] = Field(
        "earliest",
        description="Where a group without a commit starts: earliest: answer requests already "
        "on the topic; latest: only new ones.",
    )
    session_timeout_ms: int = Field(
        30_000,
        ge=6_000,
        le=300_000,
        description="A member silent this long leaves the group (the broker's "
        "group.min/max.session.timeout.ms bound it: 6 s to 5 min by default).",
    )
    heartbeat_interval_ms: int = Field(
        3_000, ge=100, description="Heartbeat period; at most a third of the session timeout."
    )
    max_poll_interval_ms: int = Field(
        300_000, ge=10_000, description="Longest gap between polls before the member is dropped."
    )
    rebalance_timeout_ms: int = Field(
        60_000,
        ge=1_000,
        description="Time every member gets to rejoin a rebalance; a revoke commits what is "
        "finished within four fifths of it and keeps the rest of its work for the next assignment.",
    )

    @model_validator(mode="after")
    def _check_heartbeat(self) -> Self:
        if self.heartbeat_interval_ms * 3 > self.session_timeout_ms:
            raise ValueError(
                f"heartbeat_interval_ms={self.heartbeat_interval_ms} must be at most a third of "
                f"session_timeout_ms={self.session_timeout_ms}"
            )
        return self


class PollSettings(BaseModel):
    """One fetch: how many records and how long to wait for them."""

    model_config = _GROUP

    poll_max_records: int = Field(500, ge=1, description="Most records taken from one fetch.")
    poll_timeout_ms: int = Field(50, ge=0, description="Longest wait of one fetch.")


class SinkSettings(BaseModel):
    """The reply producer's delivery deadline (retries follow until the sink closes)."""

    model_config = _GROUP

    send_timeout_ms: int = Field(30_000, ge=100, description="Deadline of one send attempt.")
