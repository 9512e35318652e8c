"""Pydantic v2 models of the request and reply values (CONTRACT.md §Request record, §Reply record).

The models describe values; the bytes are the codec's business (``schemas.codec``). They are
frozen and validate strictly: a ``bool`` is not an ``int``, an ``int`` is not a ``str``; a float
field takes an ``int`` (JSON writes ``1.0`` as ``1`` in some languages) but never NaN or ±Infinity.
Unknown fields are ignored in both directions (forward compatibility).

Limits that depend on configuration (``max_text_bytes``, ``max_meta_bytes``) or on the encoding
(meta size in bytes) are enforced by ``schemas.codec.decode_request``, not here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_serializer,
    model_validator,
)
from pydantic.types import FiniteFloat

from schemas.errors import ErrorCode

__all__ = [
    "CONTRACT_VERSION",
    "ClassifyResult",
    "EmbedResult",
    "ErrorInfo",
    "ModelInfo",
    "Reply",
    "Request",
    "Status",
    "Task",
    "Timing",
    "result_from_map",
]

CONTRACT_VERSION: Final = 1
"""The only version this code speaks (field ``v``)."""

MAX_DEADLINE_MS: Final = 2**63 - 1
"""``deadline_ms`` must fit a signed 64-bit integer (Java ``long``)."""

Task = Literal["embed", "classify"]
"""The two task names (CONTRACT.md §Request record, ``task``)."""

Status = Literal["ok", "error", "expired"]
"""Reply status, also sent as the ``kbatch-status`` header (CONTRACT.md §Reply record)."""


def _not_bool(value: object) -> object:
    # Literal[1] accepts True (True == 1); the contract's ints are never booleans.
    if isinstance(value, bool):
        raise ValueError("must be an integer, not a boolean")
    return value


Version = Annotated[Literal[1], BeforeValidator(_not_bool)]

_FROZEN_STRICT = ConfigDict(strict=True, extra="ignore", frozen=True)


class Request(BaseModel):
    """The request value: a map in msgpack or JSON (CONTRACT.md §Request record).

    ``text`` must be non-empty (whitespace-only is valid); its UTF-8 size limit
    (``max_text_bytes``) and the ``meta`` size limit are checked by the codec. A null optional
    field counts as absent (Jackson and friends write nulls).
    """

    model_config = _FROZEN_STRICT

    text: Annotated[
        str,
        Field(
            min_length=1,
            description="The input, a non-empty UTF-8 string of at most max_text_bytes bytes "
            "(default 524288); whitespace-only is valid.",
        ),
    ]
    task: Task | None = Field(
        default=None,
        description='"embed" or "classify"; must match the served model, else error '
        "unsupported_task. Absent: whatever the served model does.",
    )
    deadline_ms: Annotated[int, Field(ge=0, le=MAX_DEADLINE_MS)] | None = Field(
        default=None,
        description="Unix epoch milliseconds after which the answer is useless: the reply is "
        '"expired" and nothing is computed.',
    )
    truncate: bool | None = Field(
        default=None,
        description="Input longer than the model's maximum length: true truncates, false "
        "rejects with input_too_long; absent: the server's policy (truncation by default).",
    )
    meta: dict[str, Any] | None = Field(
        default=None,
        description="Any map with string keys, at most max_meta_bytes (default 4096) bytes in "
        "the request's encoding; echoed verbatim in every reply to this record.",
    )
    v: Version = Field(
        default=CONTRACT_VERSION,
        description="Contract version; any other integer gets error unsupported_version.",
    )


class ModelInfo(BaseModel):
    """The served model: ``name`` and ``revision`` (its version when known, else None)."""

    model_config = _FROZEN_STRICT

    name: str
    revision: str | None = None


class EmbedResult(BaseModel):
    """An embedding: ``embedding`` is ``(dim,)`` floats; float32 on the msgpack wire."""

    model_config = _FROZEN_STRICT

    embedding: list[FiniteFloat]
    dim: Annotated[int, Field(ge=1)]

    @model_validator(mode="after")
    def _dim_matches(self) -> EmbedResult:
        if self.dim != len(self.embedding):
            raise ValueError(
                f"dim is {self.dim} but the embedding has {len(self.embedding)} values"
            )
        return self


class ClassifyResult(BaseModel):
    """A classification: the top ``label`` and its ``score``; ``scores`` maps every label of
    the model's ``id2label`` to its softmax probability."""

    model_config = _FROZEN_STRICT

    label: str
    score: FiniteFloat
    scores: dict[str, FiniteFloat]

    @model_validator(mode="after")
    def _label_in_scores(self) -> ClassifyResult:
        if self.label not in self.scores:
            raise ValueError(f"label {self.label!r} is not one of the scores' labels")
        return self


class ErrorInfo(BaseModel):
    """``{"code", "message"}`` of an ``error`` or ``expired`` reply."""

    model_config = _FROZEN_STRICT

    code: Annotated[ErrorCode, Field(strict=False)]
    message: str

    @field_serializer("code")
    def _code_as_str(self, code: ErrorCode) -> str:
        return code.value


class Timing(BaseModel):
    """Where the time went for an ``ok`` reply (a dedup reply carries its source's timing).

    ``queue_ms``: arrival to batch start; ``infer_ms``: the batch's forward pass;
    ``batch_size``: records in that batch; ``padded_len``: its padded length in tokens.
    """

    model_config = _FROZEN_STRICT

    queue_ms: Annotated[FiniteFloat, Field(ge=0)]
    infer_ms: Annotated[FiniteFloat, Field(ge=0)]
    batch_size: Annotated[int, Field(ge=1)]
    padded_len: Annotated[int, Field(ge=0)]


class Reply(BaseModel):
    """The reply value (CONTRACT.md §Reply record).

    Invariants: ``ok`` has ``result`` and ``timing`` and no ``error``; ``error`` and ``expired``
    have ``error`` and no ``result``; ``expired`` has code ``deadline_exceeded``. Optional
    fields that are None (``result``, ``error``, ``meta``, ``timing``) are left off the wire.

    Raises:
        pydantic.ValidationError: on construction, when an invariant does not hold.
    """

    model_config = ConfigDict(
        strict=True,
        extra="ignore",
        frozen=True,
        json_schema_extra={
            "allOf": [
                {
                    "if": {"properties": {"status": {"const": "ok"}}},
                    "then": {"required": ["result", "timing"]},
                },
                {
                    "if": {"properties": {"status": {"enum": ["error", "expired"]}}},
                    "then": {"required": ["error"]},
                },
            ]
        },
    )

    v: Version = CONTRACT_VERSION
    status: Status
    result: EmbedResult | ClassifyResult | None = None
    error: ErrorInfo | None = None
    model: ModelInfo
    truncated: bool = Field(
        default=False, description="Whether the input was cut to the model's maximum length."
    )
    dedup: bool = Field(
        default=False,
        description="True when answered from another copy of the same key, without computing.",
    )
    meta: dict[str, Any] | None = Field(
        default=None, description="The request's meta, verbatim; absent when it sent none."
    )
    timing: Timing | None = None

    @model_validator(mode="after")
    def _status_shape(self) -> Reply:
        if self.status == "ok":
            if self.result is None or self.timing is None:
                raise ValueError("an ok reply needs result and timing")
            if self.error is not None:
                raise ValueError("an ok reply has no error")
        else:
            if self.error is None:
                raise ValueError(f"an {self.status} reply needs error")
            if self.result is not None:
                raise ValueError(f"an {self.status} reply has no result")
            if self.status == "expired" and self.error.code is not ErrorCode.DEADLINE_EXCEEDED:
                raise ValueError("an expired reply has error code deadline_exceeded")
        return self

    def to_wire(self) -> dict[str, Any]:
        """The value as plain Python objects, in wire order, optional None fields left off.

        ``meta`` is passed through as the very objects it holds (msgpack ext types, bytes), so
        it is echoed verbatim.
        """
        wire: dict[str, Any] = {"v": self.v, "status": self.status}
        if self.result is not None:
            wire["result"] = self.result.model_dump()
        if self.error is not None:
            wire["error"] = self.error.model_dump()
        wire["model"] = self.model.model_dump()
        wire["truncated"] = self.truncated
        wire["dedup"] = self.dedup
        if self.meta is not None:
            wire["meta"] = self.meta
        if self.timing is not None:
            wire["timing"] = self.timing.model_dump()
        return wire


def result_from_map(result: Mapping[str, Any]) -> EmbedResult | ClassifyResult:
    """The typed result for a contract ``result`` map (e.g. ``ItemOutcome.result``).

    ``{"embedding": [...], "dim": n}`` gives an ``EmbedResult``; anything else is validated as
    a ``ClassifyResult`` (``{"label", "score", "scores"}``).

    Raises:
        pydantic.ValidationError: when the map is neither shape.
    """
    if "embedding" in result:
        return EmbedResult.model_validate(result)
    return ClassifyResult.model_validate(result)
