"""Validated, frozen settings of ``kbatch backfill``: units in names, one source of truth.

As for ``kbatch serve`` (:mod:`consumer.config`), every field is a CLI flag, an environment
variable and a key of the optional YAML file; precedence flag > environment > file > default.
The variables are backfill's own, ``KBATCH_BACKFILL_*`` (``KBATCH_BACKFILL_GROUP_ID``), so
what is exported for serve (``KBATCH_GROUP_ID``, ``KBATCH_DLQ_TOPIC``) does not steer a
backfill; only the connection settings (bootstrap, TLS, SASL) are also read from serve's
``KBATCH_*`` (:data:`consumer.config.CONNECTION_FIELDS`). ``range_from``/``range_to`` are the
flags ``--from``/``--to``.

Batching defaults differ from serve's on purpose: a backfill's backlog is full, so waits are
off (``max_wait_ms=0``, no adaptive wait) and the token budget is the engine bench's (2048
padded tokens on a CPU, 16384 on CUDA), where throughput stops improving.

Errors raised: :class:`pydantic.ValidationError` for a value out of range, a range bound that
does not parse, or a combination that cannot work (the message names the values).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from consumer.batching.config import BatchPolicyConfig
from consumer.config import (
    BACKFILL_CONFIG,
    CONNECTION_FIELDS,
    ModelSettings,
    RunSettings,
    SettingsBase,
    project,
)
from consumer.kafka.config import KafkaClientSettings, PollSettings, SinkSettings
from consumer.kafka.ranges import AtOffsets, AtTime, RangeBound, parse_bound
from consumer.options import EmbedOptions
from consumer.replies.task_options import TaskOptions
from consumer.tracing.settings import TracingSettings
from schemas.models import Aggregation, Chunking, ChunkOutput, EncodingFormat

__all__ = ["CUDA_MAX_BATCH_TOKENS", "BackfillSettings"]

CUDA_MAX_BATCH_TOKENS = 16_384
"""Default padded-token budget on CUDA (the engine's warm-up lowers it if it does not fit)."""


class BackfillSettings(  # fields in --help: the last base's first, the class's own last
    TracingSettings,
    RunSettings,
    BatchPolicyConfig,
    SinkSettings,
    PollSettings,
    KafkaClientSettings,
    ModelSettings,
    SettingsBase,
):
    """Everything ``kbatch backfill`` can be told.

    Groups (each defined once, see :mod:`consumer.config`): the model, the Kafka client, one
    fetch, the sink, the batch policy and the run settings; the fields below are backfill's
    own. Defaults that differ from serve's: :attr:`default_overrides`, and the token budget
    (:meth:`batch_policy`).
    """

    model_config = BACKFILL_CONFIG
    shared_env_fields: ClassVar[frozenset[str]] = CONNECTION_FIELDS
    default_overrides: ClassVar[Mapping[str, Any]] = {
        "max_wait_ms": 0.0,  # the backlog is full: never wait
        "adaptive_wait": False,
        "poll_timeout_ms": 200,
    }
    help_overrides: ClassVar[Mapping[str, str]] = {
        "max_batch_tokens": "Padded tokens per batch (padded_len × n), at most; default: "
        f"{CUDA_MAX_BATCH_TOKENS} on CUDA (the warm-up lowers a budget the device cannot hold), "
        "else 2048; a budget not given is raised to the model's maximum length.",
    }

    # ---- what to read and where to write -------------------------------------------------
    source_topic: str = Field(min_length=1, description="Topic whose history is scored.")
    output_topic: str = Field(min_length=1, description="Topic the scored records go to.")
    range_from: str = Field(
        "earliest", description="Start: earliest | ISO-8601 time | P:OFFSET,… (inclusive)."
    )
    range_to: str = Field(
        "now", description="End: now | ISO-8601 time | P:OFFSET,… (exclusive), fixed at start."
    )
    text_field: str | None = Field(
        None,
        description="Dotted path of the text in a JSON or msgpack value (a.b.0.c: list "
        "indexes are numbers); default: the whole value as UTF-8 text.",
    )
    documents_field: str | None = Field(
        None,
        description="rerank: dotted path of the documents (a list of strings) in a JSON or "
        "msgpack value; --text-field is the query.",
    )
    value_format: Literal["auto", "json", "msgpack"] = Field(
        "auto",
        description="Encoding of the values when --text-field is given; auto: the "
        'content-type header, else JSON when the value starts with {, [ or ", else msgpack.',
    )

    # ---- embed options of contract 1.1, applied to every record ----------------------------
    dimensions: int | None = Field(
        None, ge=1, description="Keep the first N values of each embedding (then re-normalise)."
    )
    normalize: bool | None = Field(
        None, description="L2-normalise or not; default: as the model's config says."
    )
    prompt_name: str | None = Field(
        None, description="Prompt prepended to every text; default: --default-prompt-name."
    )
    encoding_format: EncodingFormat | None = Field(
        None, description="float (default), f32le, f16le or binary."
    )

    # ---- task options of contract 1.2, applied to every record -----------------------------
    top_n: int | None = Field(None, ge=1, description="rerank: also write the best top_n.")
    top_k: int | None = Field(
        None, ge=1, description="sparse: keep each vector's top_k largest weights."
    )
    aggregation: Aggregation | None = Field(
        None, description="token-classify: simple (default), first, max, average or none."
    )
    redact: bool | None = Field(
        None, description="token-classify: also write each text with its entities as [LABEL]."
    )

    # ---- embed chunking of contract 1.3, applied to every record ---------------------------
    chunk_max_tokens: int | None = Field(
        None,
        ge=4,
        description="embed: embed each text in chunks of at most N tokens (the request "
        "option chunking.max_tokens); default: no chunks, unless --chunk-output is given.",
    )
    chunk_overlap: int | None = Field(
        None, ge=0, description="embed: tokens consecutive chunks share (chunking.overlap)."
    )
    chunk_output: ChunkOutput | None = Field(
        None,
        description="embed: pooled (one vector per record) or chunks (every chunk's with its "
        "start/end); chunking.output.",
    )

    # ---- reading and delivery --------------------------------------------------------------
    max_in_flight_records: int = Field(
        4096,
        ge=1,
        description="Stop fetching while this many records are read and not yet acknowledged "
        "(bounds memory and what a crash repeats).",
    )
    max_concurrent_sends: int = Field(
        16,
        ge=1,
        le=4096,
        description="Sends awaiting the broker at once; more waiting sends cost CPU (they wake "
        "each other) without sending faster.",
    )

    # ---- operations ----------------------------------------------------------------------
    progress: bool | None = Field(
        None,
        description="Show the progress bar; default: when stderr is a terminal "
        "(otherwise a log line every 10 s).",
    )

    @field_validator("range_from")
    @classmethod
    def _check_from(cls, value: str) -> str:
        parse_bound(value, "from")
        return value

    @field_validator("range_to")
    @classmethod
    def _check_to(cls, value: str) -> str:
        parse_bound(value, "to")
        return value

    @field_validator("text_field", "documents_field")
    @classmethod
    def _check_text_field(cls, value: str | None) -> str | None:
        if value is not None and (not value or any(not part for part in value.split("."))):
            raise ValueError(f"field path {value!r} must be dot-separated non-empty names")
        return value

    @model_validator(mode="after")
    def _check_rerank(self) -> BackfillSettings:
        rerank = self.task == "rerank"
        if rerank and (self.documents_field is None or self.text_field is None):
            raise ValueError(
                "task=rerank reads each record's query at text_field and its documents at "
                f"documents_field (got text_field={self.text_field!r}, "
                f"documents_field={self.documents_field!r})"
            )
        if not rerank and self.documents_field is not None:
            raise ValueError(f"documents_field is for task=rerank, not task={self.task}")
        if self.chunking is not None and self.task != "embed":
            raise ValueError(f"chunk_* settings are for task=embed, not task={self.task}")
        return self

    @model_validator(mode="after")
    def _check_topics(self) -> BackfillSettings:
        if self.source_topic == self.output_topic:
            raise ValueError(
                f"output_topic={self.output_topic!r} is the source topic: the job would "
                "never end reading its own output"
            )
        return self

    @model_validator(mode="after")
    def _check_range_order(self) -> BackfillSettings:
        """An inverted range (``--from`` after ``--to``) is an error, not an empty job."""
        start, end = self.from_bound, self.to_bound
        inverted_times = (
            isinstance(start, AtTime)
            and isinstance(end, AtTime)
            and start.timestamp_ms > end.timestamp_ms
        )
        if inverted_times:
            raise ValueError(f"--from {self.range_from} is after --to {self.range_to}")
        if isinstance(start, AtOffsets) and isinstance(end, AtOffsets):
            for p in sorted(start.offsets.keys() & end.offsets.keys()):
                if start.offsets[p] > end.offsets[p]:
                    raise ValueError(
                        f"--from {p}:{start.offsets[p]} is after --to {p}:{end.offsets[p]} "
                        f"(partition {p})"
                    )
        return self

    # ---- derived ---------------------------------------------------------------------------

    @property
    def embed_options(self) -> EmbedOptions:
        """The embed options every record gets (``--dimensions`` … ``--encoding-format``)."""
        return EmbedOptions.of(self)

    @property
    def chunking(self) -> Chunking | None:
        """The ``chunking`` every record gets (``--chunk-*``), or None when no flag is given."""
        fields = {"max_tokens": self.chunk_max_tokens, "overlap": self.chunk_overlap,
                  "output": self.chunk_output}  # fmt: skip
        given = {name: value for name, value in fields.items() if value is not None}
        return Chunking.model_validate(given) if given else None

    @property
    def task_options(self) -> TaskOptions:
        """The 1.2 task options every record gets (``--top-n``, ``--top-k``,
        ``--aggregation``, ``--redact``; ``--encoding-format`` for sparse)."""
        return TaskOptions.of(self)

    @property
    def from_bound(self) -> RangeBound:
        """``range_from`` parsed."""
        return parse_bound(self.range_from, "from")

    @property
    def to_bound(self) -> RangeBound:
        """``range_to`` parsed."""
        return parse_bound(self.range_to, "to")

    @property
    def dead_letter_topic(self) -> str:
        """``dlq_topic``, or ``<source_topic>.dlq``."""
        return self.dlq_topic or f"{self.source_topic}.dlq"

    @property
    def effective_group_id(self) -> str:
        """``group_id``, or one derived from what defines the job's output.

        Rerunning the same command resumes; changing the range, the text field, the model,
        the task or an embed option (prompt included) starts a new job from the range's start.
        """
        if self.group_id:
            return self.group_id
        parts = [
            self.range_from,
            self.range_to,
            self.text_field or "",
            self.model,
            self.model_revision or "",
            self.task,
        ]
        options = (self.default_prompt_name, *dataclasses.astuple(self.embed_options))
        if any(option is not None for option in options):  # jobs without options keep their id
            parts.extend("" if option is None else str(option) for option in options)
        task_options: tuple[object, ...] = (
            self.documents_field, self.top_n, self.top_k, self.aggregation, self.redact
        )  # fmt: skip
        chunks = (self.chunk_max_tokens, self.chunk_overlap, self.chunk_output)
        if any(option is not None for option in chunks):  # contract 1.3
            task_options = (*task_options, *chunks)
        if any(option is not None for option in task_options):
            parts.extend("" if option is None else str(option) for option in task_options)
        identity = "\0".join(parts)
        digest = hashlib.sha256(identity.encode()).hexdigest()[:10]
        return f"kbatch-backfill.{self.source_topic}.{self.output_topic}.{digest}"

    def batch_policy(self, *, cuda: bool) -> BatchPolicyConfig:
        """The engine's batch-formation settings; on CUDA (``cuda``) the token budget is
        :data:`CUDA_MAX_BATCH_TOKENS` unless ``max_batch_tokens`` was given."""
        policy = project(BatchPolicyConfig, self)
        if cuda and "max_batch_tokens" not in self.model_fields_set:
            return policy.model_copy(update={"max_batch_tokens": CUDA_MAX_BATCH_TOKENS})
        return policy
