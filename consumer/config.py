"""Validated, frozen settings of ``kbatch serve``: units in names, each field defined once.

Settings come in groups, each defined once with a description and bounds per field (vLLM's
``config/`` style): :class:`RunSettings` here, :class:`consumer.model.settings.ModelSettings`
(re-exported here),
:class:`consumer.batching.config.BatchPolicyConfig`, the flow limits
(:class:`consumer.kafka.flow.FlowConfig`) and the Kafka groups of :mod:`consumer.kafka.config`.
A command's settings class (:class:`ServeSettings`, ``consumer.backfill.config.BackfillSettings``)
inherits the groups it exposes and may change only their defaults
(:attr:`SettingsBase.default_overrides`); :func:`project` cuts out one group for the adapter
that takes it.

Every field is, at once, a CLI flag (``max_batch_size`` → ``--max-batch-size``), an environment
variable (``KBATCH_MAX_BATCH_SIZE``) and a key of the optional YAML config file
(``--config kbatch.yaml``). Precedence: flag > environment > file > default.

Each command reads the variables of its own prefix (:attr:`SettingsBase.model_config`'s
``env_prefix``): ``kbatch serve`` ``KBATCH_*``, ``kbatch backfill`` ``KBATCH_BACKFILL_*``
(:data:`BACKFILL_CONFIG`), so a variable exported for serve (``KBATCH_GROUP_ID``, say) never
steers a backfill. The connection settings (:data:`CONNECTION_FIELDS`: bootstrap, TLS, SASL) are
one cluster's, shared: a command with its own prefix reads them from ``KBATCH_*`` too, below its
own (:attr:`SettingsBase.shared_env_fields`).

Errors raised: :class:`pydantic.ValidationError` for a value out of range or a combination that
cannot work (the message names the values).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from consumer.batching.config import BatchPolicyConfig
from consumer.config_sources import CommaListEnvSource, read_config_file
from consumer.kafka.config import (
    ConsumerGroupSettings,
    KafkaClientSettings,
    PollSettings,
    SinkSettings,
)
from consumer.kafka.flow import FlowConfig
from consumer.model.settings import PACKAGED_MODEL, ModelSettings
from consumer.tracing.settings import TracingSettings

__all__ = [
    "BACKFILL_CONFIG",
    "COMMAND_CONFIG",
    "CONNECTION_FIELDS",
    "DEFAULT_JOBS_TOPIC",
    "PACKAGED_MODEL",
    "SHARED_ENV_PREFIX",
    "JobsSettings",
    "ModelSettings",
    "RunSettings",
    "ServeSettings",
    "SettingsBase",
    "load_settings",
    "project",
]

_GROUP = ConfigDict(frozen=True, extra="forbid")

SHARED_ENV_PREFIX = "KBATCH_"
"""The prefix of ``kbatch serve``'s variables and of the shared :data:`CONNECTION_FIELDS`."""

COMMAND_CONFIG = SettingsConfigDict(env_prefix=SHARED_ENV_PREFIX, frozen=True, extra="forbid")
"""A command's settings: ``KBATCH_*`` variables, frozen, unknown names refused."""

BACKFILL_CONFIG = SettingsConfigDict(env_prefix="KBATCH_BACKFILL_", frozen=True, extra="forbid")
"""``kbatch backfill`` (and ``submit``): ``KBATCH_BACKFILL_*`` variables, so serve's
``KBATCH_GROUP_ID`` or ``KBATCH_DLQ_TOPIC`` do not put a backfill in serve's group or its
dead letters in serve's dead-letter topic."""

CONNECTION_FIELDS = frozenset(KafkaClientSettings.model_fields)
"""Where the brokers are and how to log in: the same for every command of one cluster."""


class _SharedEnvSource(CommaListEnvSource):
    """``KBATCH_<FIELD>`` for the ``fields`` a command shares with serve, nothing else."""

    def __init__(self, settings_cls: type[BaseSettings], fields: frozenset[str]) -> None:
        super().__init__(settings_cls, env_prefix=SHARED_ENV_PREFIX)
        self._fields = fields

    def __call__(self) -> dict[str, Any]:
        return {k: v for k, v in super().__call__().items() if k in self._fields}


class SettingsBase(BaseSettings):
    """The base of every command's settings: sources, redaction and per-command defaults.

    A command inherits the settings groups it exposes (each field defined once, in its group)
    and may only change defaults, through :attr:`default_overrides`.
    """

    model_config = COMMAND_CONFIG

    default_overrides: ClassVar[Mapping[str, Any]] = {}
    """Field name → this command's default, where it differs from the group's (applied when no
    flag, variable or file gives the field)."""

    help_overrides: ClassVar[Mapping[str, str]] = {}
    """Field name → this command's ``--help`` text, where the group's description does not fit
    the command (``--group-id`` of ``kbatch backfill submit``); display only."""

    shared_env_fields: ClassVar[frozenset[str]] = frozenset()
    """Fields also read from ``KBATCH_<FIELD>`` (below the command's own prefix), for a command
    whose prefix is not ``KBATCH_``: the connection settings, the same for every command."""

    @classmethod
    def env_names(cls, name: str) -> list[str]:
        """The variables field ``name`` is read from, first wins (for ``--help`` and docs)."""
        own = f"{cls.model_config.get('env_prefix', '')}{name}".upper()
        shared = f"{SHARED_ENV_PREFIX}{name}".upper()
        return [own, shared] if name in cls.shared_env_fields and shared != own else [own]

    @model_validator(mode="before")
    @classmethod
    def _command_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict) and cls.default_overrides:
            return {**cls.default_overrides, **data}
        return data

    @classmethod
    def default_of(cls, name: str) -> Any:
        """The default of field ``name`` for this command (for ``--help``)."""
        if name in cls.default_overrides:
            return cls.default_overrides[name]
        return cls.model_fields[name].default

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
        """Flags (init kwargs) > the command's variables > the shared ``KBATCH_*`` ones
        (:attr:`shared_env_fields`) > YAML file > defaults."""
        # YamlConfigSettingsSource reads model_config["yaml_file"]; load_settings sets it.
        yaml = YamlConfigSettingsSource(settings_cls)
        env = CommaListEnvSource(settings_cls)  # KBATCH_BUCKET_EDGES=16,32 as the flag takes
        fields: frozenset[str] = getattr(settings_cls, "shared_env_fields", frozenset())
        if not fields or settings_cls.model_config.get("env_prefix") == SHARED_ENV_PREFIX:
            return init_settings, env, yaml
        return init_settings, env, _SharedEnvSource(settings_cls, fields), yaml


class RunSettings(BaseModel):
    """What every consuming command has: its group, dead letters, commits, drain, logging.

    ``group_id`` and ``dlq_topic`` default per command: ``kbatch serve`` has fixed defaults;
    ``kbatch backfill`` derives them from the job (see its ``effective_group_id`` and
    ``dead_letter_topic``).
    """

    model_config = _GROUP

    group_id: str | None = Field(
        None,
        description="Consumer group id: replicas share it; a backfill resumes under it "
        "(backfill default: derived from the topics, the range, the text field, the model and "
        "the task).",
    )
    dlq_topic: str | None = Field(
        None,
        description="Dead-letter topic (backfill default: <source-topic>.dlq).",
    )
    commit_interval_ms: int = Field(
        1_000,
        ge=10,
        description="How often finished offsets are committed (with --exactly-once: how "
        "often replies become visible to read_committed readers).",
    )
    exactly_once: bool = Field(
        False,
        description="Replies, dead letters and consumed offsets in one Kafka transaction "
        "per input partition and commit interval: read_committed readers see each reply "
        "once, also after a crash (docs/operations.md §Exactly once).",
    )
    drain_timeout_s: float = Field(
        30.0, gt=0, description="SIGTERM/SIGINT: time to finish what is in flight and commit."
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="Logging level."
    )


DEFAULT_JOBS_TOPIC = "kbatch.jobs"


class JobsSettings(BaseModel):
    """Backfill jobs run by serve (docs/JOBS.md): where jobs are recorded and whether serve runs
    them; ``kbatch backfill submit/status/cancel`` take ``--jobs-topic`` from here too."""

    model_config = _GROUP

    jobs_topic: str = Field(
        DEFAULT_JOBS_TOPIC,
        min_length=1,
        description="Compacted topic of backfill jobs (kbatch backfill submit); serve (unless "
        "--no-create-topics) and submit create it when missing.",
    )
    jobs_topic_replication_factor: int | None = Field(
        None,
        ge=1,
        description="Replicas of the jobs topic when it is created; default: the cluster's "
        "default.replication.factor, else min(3, brokers).",
    )
    run_jobs: bool = Field(
        True,
        description="Run the backfill jobs of --jobs-topic in this process's spare capacity "
        "(the engine's bulk lane).",
    )


G = TypeVar("G", bound=BaseModel)


def project(group: type[G], settings: BaseModel) -> G:
    """The ``group`` part of a command's ``settings`` (a group it inherits), as the small object
    an adapter takes; validated again by the group's own rules.

    Raises:
        AttributeError: ``settings`` lacks one of the group's fields.
    """
    return group.model_validate({name: getattr(settings, name) for name in group.model_fields})


class ServeSettings(  # fields in --help: the last base's first, the class's own last
    TracingSettings,
    JobsSettings,
    RunSettings,
    FlowConfig,
    BatchPolicyConfig,
    SinkSettings,
    PollSettings,
    ConsumerGroupSettings,
    KafkaClientSettings,
    ModelSettings,
    SettingsBase,
):
    """Everything ``kbatch serve`` can be told. See docs/serving.md for the tuning guide.

    Groups: :class:`ModelSettings`, :class:`~consumer.kafka.config.KafkaClientSettings`,
    :class:`~consumer.kafka.config.ConsumerGroupSettings`,
    :class:`~consumer.kafka.config.PollSettings`, :class:`~consumer.kafka.config.SinkSettings`,
    :class:`~consumer.batching.config.BatchPolicyConfig`, the flow limits
    (:class:`~consumer.kafka.flow.FlowConfig`) and :class:`RunSettings`; the fields below are
    serve's own.
    """

    model_config = COMMAND_CONFIG
    default_overrides: ClassVar[Mapping[str, Any]] = {
        "group_id": "kbatch",
        "dlq_topic": "kbatch.requests.dlq",
    }
    help_overrides: ClassVar[Mapping[str, str]] = {
        "batch_timeout_s": "A batch running longer makes the engine unhealthy (/readyz 503); 3 "
        "times as long wedges it: /healthz 503, serve leaves the group and exits 4.",
    }

    # ---- Kafka topology -------------------------------------------------------------------
    request_topic: str = Field("kbatch.requests", description="Topic the requests arrive on.")
    reply_topic: str = Field("kbatch.replies", description="Reply topic when a request names none.")
    allowed_reply_topics: str | None = Field(
        None,
        description="Regular expression (full match) of the other topics a request's "
        "kafka_replyTopic may name; default: only --reply-topic. The request, dead-letter and "
        "__* topics are never allowed; others are dead-lettered reply_topic_not_allowed.",
    )
    create_topics: bool = Field(
        True,
        description="Create the request, reply, dead-letter and jobs topics when missing.",
    )
    topic_partitions: int = Field(
        6, ge=1, description="Partitions of a created request/reply topic (the DLQ gets 1)."
    )
    topic_replication_factor: int | None = Field(
        None,
        ge=1,
        description="Replicas of a created request, reply or dead-letter topic; default: the "
        "cluster's default.replication.factor, else min(3, brokers). Fewer than 3, or not more "
        "than min.insync.replicas, is warned about.",
    )

    # ---- delivery ----------------------------------------------------------------------------
    dedup_ttl_s: float = Field(
        300.0,
        gt=0,
        description="How long a finished key is remembered, so a retry gets the same reply.",
    )
    dedup_max_entries: int = Field(100_000, ge=1, description="Most finished keys remembered.")

    # ---- operations ----------------------------------------------------------------------------
    metrics_port: int = Field(
        9400, ge=0, le=65535, description="Port of /metrics, /healthz and /readyz; 0 disables them."
    )
    metrics_host: str = Field(
        "127.0.0.1", description="Bind address of /metrics, /healthz, /readyz."
    )
    replicas: int = Field(
        1,
        ge=1,
        le=256,
        description="Consumer processes on this host, one group: a supervisor starts them, "
        "forwards SIGTERM/SIGINT, restarts one that dies and serves one /metrics and /readyz "
        "for the host (each replica gets an even share of the CPU budget: --cpu-budget is "
        "split, --torch-threads is per replica).",
    )

    @model_validator(mode="after")
    def _check_serve(self) -> ServeSettings:
        for name in ("group_id", "dlq_topic"):
            if getattr(self, name) is None:
                raise ValueError(f"{name}=None: kbatch serve needs one")
        if self.group_protocol == "consumer" and self.kafka_client != "confluent":
            raise ValueError(
                "--group-protocol consumer needs --kafka-client confluent (aiokafka speaks the "
                "classic protocol only)"
            )
        if self.allowed_reply_topics is not None:
            try:
                re.compile(self.allowed_reply_topics)
            except re.error as err:
                raise ValueError(
                    f"allowed_reply_topics={self.allowed_reply_topics!r} is not a regular "
                    f"expression: {err}"
                ) from err
        return self

    @property
    def effective_group_id(self) -> str:
        """``group_id`` (never None for serve)."""
        assert self.group_id is not None  # _check_serve
        return self.group_id

    @property
    def dead_letter_topic(self) -> str:
        """``dlq_topic`` (never None for serve)."""
        assert self.dlq_topic is not None  # _check_serve
        return self.dlq_topic

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


S = TypeVar("S", bound=SettingsBase)


def load_settings(cls: type[S], config_file: Path | None = None, **overrides: Any) -> S:
    """Build settings from flags (``overrides``; None means "not given"), the command's
    environment variables (:meth:`SettingsBase.env_names`) and an optional YAML file.

    Raises:
        FileNotFoundError: ``config_file`` does not exist.
        consumer.config_sources.ConfigFileError: ``config_file`` is not YAML, not a mapping or
            names an unknown setting.
        pydantic.ValidationError: an invalid value or combination
            (:func:`consumer.config_sources.describe_settings_error` names each by its source).
    """
    target = cls
    if config_file is not None:
        read_config_file(config_file, cls.model_fields)  # one clear line before pydantic's
        config = SettingsConfigDict(**{**cls.model_config, "yaml_file": config_file})
        target = type(cls.__name__, (cls,), {"model_config": config})
    return target(**{k: v for k, v in overrides.items() if v is not None})
