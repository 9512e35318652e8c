"""Validated, frozen settings of ``kbatch backfill``: units in names, one source of truth.

As for ``kbatch serve`` (:mod:`consumer.config`), every field is a CLI flag, a ``KBATCH_*``
environment variable and a key of the optional YAML file; precedence flag > environment >
file > default. ``range_from``/``range_to`` are the flags ``--from``/``--to``.

Batching defaults differ from serve's on purpose: a backfill's backlog is full, so waits are
off (``max_wait_ms=0``) and the token budget is the engine bench's (2048 padded tokens on a CPU,
16384 on CUDA), where throughput stops improving.

Errors raised: :class:`pydantic.ValidationError` for a value out of range, a range bound that
does not parse, or a combination that cannot work (the message names the values).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import (
    SettingsConfigDict,
)

from consumer.batching.config import DEFAULT_BUCKET_EDGES, BatchPolicyConfig
from consumer.config import ModelSettings
from consumer.kafka.range_source import RangeBound, parse_bound
from consumer.options import EmbedOptions
from schemas.models import EncodingFormat

__all__ = ["CPU_MAX_BATCH_TOKENS", "CUDA_MAX_BATCH_TOKENS", "BackfillSettings"]

CPU_MAX_BATCH_TOKENS = 2048
"""Default padded-token budget on a CPU (``kbatch bench engine``'s, measured on 2 cores)."""

CUDA_MAX_BATCH_TOKENS = 16_384
"""Default padded-token budget on CUDA (the engine's warm-up lowers it if it does not fit)."""


class BackfillSettings(ModelSettings):
    """Everything ``kbatch backfill`` can be told."""

    model_config = SettingsConfigDict(env_prefix="KBATCH_", frozen=True, extra="forbid")

    # ---- what to read and where to write -------------------------------------------------
    bootstrap: str = Field(
        "127.0.0.1:9092", description="Kafka bootstrap servers, comma-separated."
    )
    source_topic: str = Field(min_length=1, description="Topic whose history is scored.")
    output_topic: str = Field(min_length=1, description="Topic the scored records go to.")
    dlq_topic: str | None = Field(
        None,
        description="Dead-letter topic for records without usable text; "
        "default: <source-topic>.dlq.",
    )
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
    value_format: Literal["auto", "json", "msgpack"] = Field(
        "auto",
        description="Encoding of the values when --text-field is given; auto: the "
        'content-type header, else JSON when the value starts with {, [ or ", else msgpack.',
    )
    group_id: str | None = Field(
        None,
        description="Consumer group the job commits under (resume = same group); default: "
        "derived from the topics, the range, the text field, the model and the task.",
    )

    max_length: int | None = Field(
        None, ge=2, description="Token cap; default: the model's maximum."
    )
    truncate: bool = Field(
        True, description="Cut texts longer than the model's maximum (else: error reply)."
    )
    max_text_bytes: int = Field(
        512 * 1024,
        ge=1,
        le=16 * 1024 * 1024,
        description="Longer texts (UTF-8 bytes) are dead-lettered, as the contract's limit.",
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

    # ---- batching (see consumer.batching.config) -------------------------------------------
    max_batch_size: int = Field(64, ge=1, le=4096, description="Most records in one batch.")
    max_batch_tokens: int | None = Field(
        None,
        ge=1,
        description=f"Token budget of one batch (padded_len × size); default: "
        f"{CPU_MAX_BATCH_TOKENS} on CPU, {CUDA_MAX_BATCH_TOKENS} on CUDA.",
    )
    max_wait_ms: float = Field(
        0.0, ge=0, le=60_000, description="Bucket wait; 0: the backlog is full, never wait."
    )
    bucket_edges: list[int] | None = Field(
        None, description="Token-length bucket upper edges, e.g. 16,32,64; default: built in."
    )
    preferred_batch_sizes: list[int] | None = Field(
        None, description="Sizes a deadline flush rounds down to."
    )
    batch_timeout_s: float = Field(
        60.0, gt=0, description="A batch running longer is logged as wedged."
    )

    # ---- reading, delivery, shutdown -------------------------------------------------------
    poll_max_records: int = Field(500, ge=1, description="max_records of one fetch.")
    poll_timeout_ms: int = Field(200, ge=0, description="Longest wait of one fetch.")
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
        description="Sends awaiting the broker at once; more waiting sends only wake each "
        "other (measured with 16 KiB producer batches: 1500 at once cost 4.5 s of CPU, 16 at "
        "once 0.36 s).",
    )
    commit_interval_ms: int = Field(
        1_000, ge=10, description="How often finished offsets are committed."
    )
    send_timeout_ms: int = Field(30_000, ge=100, description="Deadline of one send attempt.")
    drain_timeout_s: float = Field(
        30.0, gt=0, description="SIGTERM/SIGINT: time to finish what is in flight and commit."
    )

    # ---- operations ----------------------------------------------------------------------
    progress: bool | None = Field(
        None,
        description="Show the progress bar; default: when stderr is a terminal "
        "(otherwise a log line every 10 s).",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

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

    @field_validator("text_field")
    @classmethod
    def _check_text_field(cls, value: str | None) -> str | None:
        if value is not None and (not value or any(not part for part in value.split("."))):
            raise ValueError(f"text_field={value!r} must be dot-separated non-empty names")
        return value

    @model_validator(mode="after")
    def _feasible(self) -> BackfillSettings:
        if self.bucket_edges is not None and self.bucket_edges != sorted(set(self.bucket_edges)):
            raise ValueError(f"bucket_edges={self.bucket_edges} must be strictly increasing")
        if self.source_topic == self.output_topic:
            raise ValueError(
                f"output_topic={self.output_topic!r} is the source topic: the job would "
                "never end reading its own output"
            )
        return self

    # ---- derived ---------------------------------------------------------------------------

    @property
    def embed_options(self) -> EmbedOptions:
        """The embed options every record gets (``--dimensions`` … ``--encoding-format``)."""
        return EmbedOptions(self.dimensions, self.normalize, self.prompt_name, self.encoding_format)

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
        identity = "\0".join(parts)
        digest = hashlib.sha256(identity.encode()).hexdigest()[:10]
        return f"kbatch-backfill.{self.source_topic}.{self.output_topic}.{digest}"

    def batch_policy(self, *, cuda: bool) -> BatchPolicyConfig:
        """The engine's batch-formation settings (``cuda`` picks the default token budget)."""
        default_budget = CUDA_MAX_BATCH_TOKENS if cuda else CPU_MAX_BATCH_TOKENS
        return BatchPolicyConfig(
            max_batch_size=self.max_batch_size,
            max_batch_tokens=self.max_batch_tokens or default_budget,
            max_wait_ms=self.max_wait_ms,
            bucket_edges=tuple(self.bucket_edges or DEFAULT_BUCKET_EDGES),
            preferred_batch_sizes=tuple(self.preferred_batch_sizes or ()),
            adaptive_wait=False,
        )
