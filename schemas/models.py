"""Pydantic v2 models of the request and reply values (CONTRACT.md §Request record, §Reply record).

The models describe values; the bytes are the codec's business (``schemas.codec``). They are
frozen and validate strictly: a ``bool`` is not an ``int``, an ``int`` is not a ``str``; a float
field takes an ``int`` (JSON writes ``1.0`` as ``1`` in some languages) but never NaN or ±Infinity.
Unknown fields are ignored in both directions (forward compatibility).

Limits that depend on configuration (``max_text_bytes``, ``max_meta_bytes``) or on the encoding
(meta size in bytes) are enforced by ``schemas.codec.decode_request``, not here.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    WithJsonSchema,
    field_serializer,
    model_validator,
)
from pydantic.types import FiniteFloat

from schemas.errors import ErrorCode

__all__ = [
    "AGGREGATIONS",
    "CONTRACT_REVISION",
    "CONTRACT_VERSION",
    "EMBED_OPTIONS",
    "ENCODING_FORMATS",
    "MAX_DOCUMENTS",
    "TASKS",
    "TASK_OPTIONS",
    "Aggregation",
    "ChunkOutput",
    "ChunkedEmbedResult",
    "Chunking",
    "ClassifyResult",
    "DocumentWindow",
    "EmbedChunk",
    "EmbedResult",
    "EncodingFormat",
    "Entity",
    "ErrorInfo",
    "ModelInfo",
    "Reply",
    "Request",
    "RerankResult",
    "SparseResult",
    "Status",
    "Task",
    "Timing",
    "TokenClassifyResult",
    "Usage",
    "embedding_bytes",
    "reply_wire",
    "result_from_map",
]

CONTRACT_VERSION: Final = 1
"""The only version this code speaks (field ``v``)."""

CONTRACT_REVISION: Final = "1.4"
"""The contract revision this server implements, sent as ``model.contract`` in every reply
(CONTRACT.md §Additions in 1.1 to 1.4; ``v`` stays 1)."""

MAX_DEADLINE_MS: Final = 2**63 - 1
"""``deadline_ms`` must fit a signed 64-bit integer (Java ``long``)."""

Task = Literal["embed", "classify", "rerank", "sparse", "token-classify"]
"""The task names (CONTRACT.md §Request record, ``task``; the last three since 1.2)."""

TASKS: Final[tuple[Task, ...]] = ("embed", "classify", "rerank", "sparse", "token-classify")

MAX_DOCUMENTS: Final = 64
"""At most this many ``documents`` in one rerank request (CONTRACT.md §Additions in 1.2): each
(query, document) pair is one sequence for the model, so one request is at most 64 rows."""

Aggregation = Literal["none", "simple", "first", "max", "average"]
"""How token-classify groups tokens into entities (transformers' ``aggregation_strategy``)."""

AGGREGATIONS: Final[tuple[Aggregation, ...]] = ("none", "simple", "first", "max", "average")

Status = Literal["ok", "error", "expired"]
"""Reply status, also sent as the ``kbatch-status`` header (CONTRACT.md §Reply record)."""

Priority = Literal["live", "bulk"]
"""A request's lane (CONTRACT.md §Additions in 1.2, ``priority``): ``live`` requests go first,
``bulk`` ones use the capacity live work leaves idle (the engine's lanes)."""

EncodingFormat = Literal["float", "f32le", "f16le", "binary"]
"""How ``result.embedding`` is sent (CONTRACT.md §Additions in 1.1, ``encoding_format``)."""

ENCODING_FORMATS: Final[tuple[EncodingFormat, ...]] = ("float", "f32le", "f16le", "binary")

_BYTES_PER_VALUE: Final = {"f32le": 4, "f16le": 2}


def embedding_bytes(encoding_format: str, dim: int) -> int | None:
    """Bytes of an embedding of ``dim`` dimensions sent as ``encoding_format``: ``4·dim``
    (f32le), ``2·dim`` (f16le), ``⌈dim/8⌉`` (binary: one bit per dimension); None for
    ``float`` (a list, not bytes)."""
    if encoding_format == "binary":
        return (dim + 7) // 8
    per_value = _BYTES_PER_VALUE.get(encoding_format)
    return None if per_value is None else per_value * dim


def _not_bool(value: object) -> object:
    # Literal[1] accepts True (True == 1); the contract's ints are never booleans.
    if isinstance(value, bool):
        raise ValueError("must be an integer, not a boolean")
    return value


Version = Annotated[Literal[1], BeforeValidator(_not_bool)]

_FROZEN_STRICT = ConfigDict(strict=True, extra="ignore", frozen=True)


EMBED_OPTIONS: tuple[str, ...] = ("dimensions", "normalize", "prompt_name", "encoding_format")
"""The names of contract 1.1's embed options: fields of :class:`Request`, of
``consumer.options.EmbedOptions`` and of ``kbatch backfill``'s settings. Every list of them
(``has_embed_options``, the request codec, ``EmbedOptions.of``) is derived from this one, so a
new option cannot be forgotten on one path (tests/unit/test_embed_options.py holds the fields
to it)."""

TASK_OPTIONS: Final[Mapping[str, Task]] = {
    "documents": "rerank",
    "top_n": "rerank",
    "top_k": "sparse",
    "aggregation": "token-classify",
    "redact": "token-classify",
    "chunking": "embed",
}
"""Contract 1.2's request options (fields of :class:`Request`) and 1.3's ``chunking``, each →
the one task it belongs to: the one list of them (the request codec,
``consumer.replies.task_options``)."""


ChunkOutput = Literal["pooled", "chunks"]
"""What a chunked embed request gets back (contract 1.3): one pooled vector, or each chunk's."""


class Chunking(BaseModel):
    """Contract 1.3, embed: split the text into chunks of at most ``max_tokens`` tokens
    (special tokens and the prompt included; absent: the model's maximum) sharing about
    ``overlap`` tokens, embed each, and answer one ``pooled`` vector (the token-weighted mean
    of the chunks' vectors, re-normalised when the model normalises) or every chunk's vector
    with its ``start``/``end`` characters (``output: "chunks"``)."""

    model_config = _FROZEN_STRICT

    max_tokens: Annotated[int, Field(ge=4)] | None = Field(
        default=None,
        description="Tokens per chunk at most, special tokens and prompt included; absent: "
        "the model's maximum; more than it is invalid_option.",
    )
    overlap: Annotated[int, Field(ge=0)] = Field(
        default=0, description="Tokens consecutive chunks share (about: chunks start at words)."
    )
    output: ChunkOutput = Field(
        default="pooled",
        description='"pooled": one vector, the token-weighted mean of the chunks\' vectors; '
        '"chunks": result.chunks, every chunk\'s vector with its start/end characters.',
    )


def _text_or_query(schema: dict[str, Any]) -> None:
    """JSON Schema: ``text`` or its rerank alias ``query`` (contract 1.2) is required."""
    schema["properties"]["query"] = {
        "type": "string",
        "minLength": 1,
        "description": "rerank (contract 1.2): the query, another name for text; send one.",
    }
    schema["required"] = [name for name in schema.get("required", []) if name != "text"]
    if not schema["required"]:
        del schema["required"]
    schema["anyOf"] = [{"required": ["text"]}, {"required": ["query"]}]


class Request(BaseModel):
    """The request value: a map in msgpack or JSON (CONTRACT.md §Request record).

    ``text`` must be non-empty (whitespace-only is valid); its UTF-8 size limit
    (``max_text_bytes``) and the ``meta`` size limit are checked by the codec. A null optional
    field counts as absent (Jackson and friends write nulls).
    """

    model_config = ConfigDict(
        strict=True, extra="ignore", frozen=True, json_schema_extra=_text_or_query
    )

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
    # ---- contract 1.1: embed options (on a classify request: error invalid_option) ----------
    dimensions: Annotated[int, Field(ge=1)] | None = Field(
        default=None,
        description="Keep the first N values of the pooled embedding (Matryoshka), then "
        "L2-normalise if the embedding is normalised; more than the model's dimension is "
        "invalid_option.",
    )
    normalize: bool | None = Field(
        default=None,
        description="L2-normalise (true) or not (false); absent: as the model's "
        "sentence-transformers config says.",
    )
    prompt_name: str | None = Field(
        default=None,
        description="Prepend the model's prompt of that name (config_sentence_transformers.json "
        "prompts) to the text before tokenizing; unknown: invalid_option; absent: the "
        "server's default prompt, if any.",
    )
    encoding_format: EncodingFormat | None = Field(
        default=None,
        description='How result.embedding is sent: "float" (default, a list), "f32le" / '
        '"f16le" (little-endian float32/float16 bytes), "binary" (1 bit per dimension, 1 '
        "where > 0, most significant bit first); bytes are msgpack bin, JSON base64.",
    )

    # ---- contract 1.2: the rerank, sparse and token-classify options ----------------------
    documents: (
        Annotated[
            list[Annotated[str, Field(min_length=1)]],
            Field(min_length=1, max_length=MAX_DOCUMENTS),
        ]
        | None
    ) = Field(
        default=None,
        description="rerank: 1 to 64 non-empty documents scored against the query (text, or "
        "its alias query); the whole value stays within the request size limit.",
    )
    top_n: Annotated[int, Field(ge=1)] | None = Field(
        default=None,
        description="rerank: also answer result.top, the best top_n documents as "
        "{index, score}, highest score first.",
    )
    top_k: Annotated[int, Field(ge=1)] | None = Field(
        default=None,
        description="sparse: keep only the top_k largest weights (sentence-transformers' "
        "max_active_dims).",
    )
    aggregation: Aggregation | None = Field(
        default=None,
        description='token-classify: "simple" (default), "first", "max", "average" or "none", '
        "as the transformers pipeline's aggregation_strategy.",
    )
    redact: bool | None = Field(
        default=None,
        description="token-classify: also answer result.redacted, the text with every entity "
        "replaced by [LABEL].",
    )

    # ---- contract 1.3 ---------------------------------------------------------------------
    chunking: Chunking | None = Field(
        default=None,
        description="embed: embed the text in chunks (max_tokens, overlap) and answer one "
        'pooled vector or, with output "chunks", each chunk\'s (contract 1.3).',
    )

    priority: Priority | None = Field(
        default=None,
        description='Any task: "live" (default) or "bulk". Bulk requests are computed in the '
        "capacity live requests leave idle (and a minimum share), never in a batch with live "
        "ones; for clients that mix interactive and offline work on one topic. Not part of "
        "the dedup key: a retry with another priority is the same request.",
    )

    _named_query: bool = PrivateAttr(default=False)

    @model_validator(mode="wrap")
    @classmethod
    def _query_is_text(cls, data: Any, handler: ModelWrapValidatorHandler[Request]) -> Request:
        # A rerank request may name its query "query" (TEI's /rerank); it is the text. The
        # request remembers it did (named_query): on another task it is invalid_option.
        named = isinstance(data, dict) and data.get("query") is not None
        if named and data.get("text") is None:
            data = {k: v for k, v in data.items() if k != "query"} | {"text": data["query"]}
        request = handler(data)
        request._named_query = named
        return request

    @property
    def named_query(self) -> bool:
        """Whether the request named the rerank field ``query`` (contract 1.2), with or
        without ``text``: on a task other than rerank it is ``invalid_option``."""
        return self._named_query

    @property
    def has_embed_options(self) -> bool:
        """Whether any of the four embed options is set (even to its default value)."""
        return any(getattr(self, name) is not None for name in EMBED_OPTIONS)


class ModelInfo(BaseModel):
    """The served model: ``name``, ``revision`` (its version when known, else None) and the
    ``contract`` revision the server implements (``"1.4"`` today)."""

    model_config = _FROZEN_STRICT

    name: str
    revision: str | None = None
    contract: str | None = Field(
        default=CONTRACT_REVISION,
        description='The contract revision the server implements ("1.4" today); absent from '
        "1.0 servers.",
    )


_EmbeddingBytes = Annotated[
    bytes,
    WithJsonSchema(
        {
            "type": "string",
            "contentEncoding": "base64",
            "description": "f32le/f16le/binary bytes: msgpack bin; in JSON standard base64 "
            "with padding.",
        }
    ),
]


class EmbedResult(BaseModel):
    """An embedding of ``dim`` dimensions (after ``dimensions``), sent as ``format``.

    ``float``: ``embedding`` is ``dim`` floats (float32 on the msgpack wire); ``f32le`` /
    ``f16le``: ``4·dim`` / ``2·dim`` little-endian bytes; ``binary``: ``⌈dim/8⌉`` bytes, one bit
    per dimension, most significant bit first. Bytes are msgpack ``bin``; in JSON a standard
    base64 string, which validation turns back into bytes.
    """

    model_config = _FROZEN_STRICT

    embedding: list[FiniteFloat] | _EmbeddingBytes
    dim: Annotated[int, Field(ge=1)]
    format: EncodingFormat = "float"

    @model_validator(mode="before")
    @classmethod
    def _base64_to_bytes(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("embedding"), str):
            if data.get("format", "float") == "float":
                raise ValueError('a "float" embedding is a list of numbers')
            try:
                raw = base64.b64decode(data["embedding"], validate=True)
            except (binascii.Error, ValueError):
                raise ValueError("embedding is not valid base64") from None
            return {**data, "embedding": raw}
        return data

    @model_validator(mode="after")
    def _dim_matches(self) -> EmbedResult:
        size = embedding_bytes(self.format, self.dim)
        if size is None:
            if not isinstance(self.embedding, list):
                raise ValueError('a "float" embedding is a list of numbers')
            if self.dim != len(self.embedding):
                raise ValueError(
                    f"dim is {self.dim} but the embedding has {len(self.embedding)} values"
                )
        elif not isinstance(self.embedding, bytes) or len(self.embedding) != size:
            raise ValueError(f"a {self.format} embedding of dim {self.dim} is {size} bytes")
        return self


class EmbedChunk(BaseModel):
    """One chunk of a chunked embed answer (contract 1.3): its ``embedding`` (as
    :class:`EmbedResult`'s, in the result's ``format``) and its span ``[start, end)`` in the
    request's text, in characters (code points)."""

    model_config = _FROZEN_STRICT

    embedding: list[FiniteFloat] | _EmbeddingBytes
    start: Annotated[int, Field(ge=0)]
    end: Annotated[int, Field(ge=0)]


class ChunkedEmbedResult(BaseModel):
    """A chunked embed answer with ``output: "chunks"`` (contract 1.3): every chunk's vector,
    in text order, each of ``dim`` dimensions sent as ``format``."""

    model_config = _FROZEN_STRICT

    chunks: Annotated[list[EmbedChunk], Field(min_length=1)]
    dim: Annotated[int, Field(ge=1)]
    format: EncodingFormat = "float"

    @model_validator(mode="before")
    @classmethod
    def _chunks_as_embeddings(cls, data: Any) -> Any:
        # each chunk's embedding checked (base64, size for the format) as an EmbedResult's
        if not (isinstance(data, dict) and isinstance(data.get("chunks"), list)):
            return data
        chunks = []
        for chunk in data["chunks"]:
            if isinstance(chunk, dict) and "embedding" in chunk:
                one = EmbedResult.model_validate(
                    {"embedding": chunk["embedding"], "dim": data.get("dim"),
                     "format": data.get("format", "float")}
                )  # fmt: skip
                chunk = {**chunk, "embedding": one.embedding}
            chunks.append(chunk)
        return {**data, "chunks": chunks}


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


class DocumentWindow(BaseModel):
    """Contract 1.3: the window of a document longer than one that its score comes from (the
    best window's, MaxP): ``index`` among the document's ``count`` windows, ``start``/``end``
    its span in the document in characters (code points, end exclusive)."""

    model_config = _FROZEN_STRICT

    index: Annotated[int, Field(ge=0)]
    count: Annotated[int, Field(ge=2)]
    start: Annotated[int, Field(ge=0)]
    end: Annotated[int, Field(ge=0)]


class RankedDocument(BaseModel):
    """One entry of a rerank result's ``top``: the document's ``index`` in the request's
    ``documents``, its ``score`` and, since 1.3, for a document scored in windows, the
    ``window`` the score comes from."""

    model_config = _FROZEN_STRICT

    index: Annotated[int, Field(ge=0)]
    score: FiniteFloat
    window: DocumentWindow | None = None


class RerankResult(BaseModel):
    """A rerank answer (contract 1.2): ``scores[i]`` is document ``i``'s relevance to the
    query, in request order (the cross-encoder's logit, or its sigmoid/softmax as the model's
    sentence-transformers config says: ``CrossEncoder.predict``); ``top`` (only with
    ``top_n``) the best ``top_n`` documents, highest score first, ties by index."""

    model_config = _FROZEN_STRICT

    scores: Annotated[list[FiniteFloat], Field(min_length=1)]
    top: list[RankedDocument] | None = None

    @model_validator(mode="after")
    def _top_in_range(self) -> RerankResult:
        if self.top is not None and any(d.index >= len(self.scores) for d in self.top):
            raise ValueError("a top index is beyond the scores")
        return self


_SparseBytes = Annotated[
    bytes,
    WithJsonSchema(
        {
            "type": "string",
            "contentEncoding": "base64",
            "description": "f32le/f16le: indices as little-endian uint32 bytes, values as "
            "float32/float16 bytes; msgpack bin, in JSON base64.",
        }
    ),
]


class SparseResult(BaseModel):
    """A sparse embedding (contract 1.2): the non-zero weights of a ``dim``-sized vector
    (``dim`` = the vocabulary size), ``indices`` ascending. ``format`` ``float``: two lists;
    ``f32le``/``f16le``: ``indices`` as little-endian uint32 bytes and ``values`` as
    float32/float16 bytes (msgpack bin; JSON base64)."""

    model_config = _FROZEN_STRICT

    indices: list[Annotated[int, Field(ge=0)]] | _SparseBytes
    values: list[FiniteFloat] | _SparseBytes
    dim: Annotated[int, Field(ge=1)]
    format: EncodingFormat = "float"

    @model_validator(mode="before")
    @classmethod
    def _base64_to_bytes(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("format", "float") != "float":
            data = dict(data)
            for name in ("indices", "values"):
                if isinstance(data.get(name), str):
                    try:
                        data[name] = base64.b64decode(data[name], validate=True)
                    except (binascii.Error, ValueError):
                        raise ValueError(f"{name} is not valid base64") from None
        return data

    @model_validator(mode="after")
    def _shapes_match(self) -> SparseResult:
        if self.format == "binary":
            raise ValueError("a sparse result is float, f32le or f16le")
        if self.format == "float":
            if not isinstance(self.indices, list) or not isinstance(self.values, list):
                raise ValueError('a "float" sparse result is two lists')
            count = len(self.indices)
            if len(self.values) != count:
                raise ValueError(f"{count} indices but {len(self.values)} values")
            return self
        if not isinstance(self.indices, bytes) or not isinstance(self.values, bytes):
            raise ValueError(f"a {self.format} sparse result is two byte strings")
        width = 4 if self.format == "f32le" else 2
        if len(self.indices) % 4 or len(self.values) != len(self.indices) // 4 * width:
            raise ValueError(
                f"{len(self.indices)} index bytes and {len(self.values)} value bytes do not "
                f"make whole uint32/{self.format} pairs"
            )
        return self


class Entity(BaseModel):
    """One entity of a token-classify result: ``label`` (the model's label, a B-/I- prefix
    removed when aggregated), ``score``, the character span ``[start, end)`` of the request's
    text (Python string indices: code points) and that ``text``."""

    model_config = _FROZEN_STRICT

    label: str
    score: FiniteFloat
    start: Annotated[int, Field(ge=0)]
    end: Annotated[int, Field(ge=0)]
    text: str


class TokenClassifyResult(BaseModel):
    """A token-classify answer (contract 1.2): ``entities`` in text order; ``redacted`` (only
    with ``redact: true``) the text with each entity's span replaced by ``[LABEL]``."""

    model_config = _FROZEN_STRICT

    entities: list[Entity]
    redacted: str | None = None


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


class Usage(BaseModel):
    """What an ``ok`` reply's computation used: ``tokens`` the model saw for this input,
    special tokens and prompt included, after truncation (CONTRACT.md §Additions in 1.1)."""

    model_config = _FROZEN_STRICT

    tokens: Annotated[int, Field(ge=0)]


ResultModel = (
    EmbedResult
    | ChunkedEmbedResult
    | ClassifyResult
    | RerankResult
    | SparseResult
    | TokenClassifyResult
)
"""Any ok reply's ``result`` (:func:`result_from_map`)."""


class Reply(BaseModel):
    """The reply value (CONTRACT.md §Reply record).

    Invariants: ``ok`` has ``result`` and ``timing`` and no ``error``; ``error`` and ``expired``
    have ``error`` and no ``result`` or ``usage``; ``expired`` has code ``deadline_exceeded``.
    Optional fields that are None (``result``, ``error``, ``meta``, ``timing``, ``usage``) are
    left off the wire.

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
    result: ResultModel | None = None
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
    usage: Usage | None = Field(
        default=None, description="ok replies of a 1.1 server: {tokens}; absent otherwise."
    )

    @model_validator(mode="after")
    def _status_shape(self) -> Reply:
        if self.status == "ok":
            if self.result is None or self.timing is None:
                raise ValueError("an ok reply needs result and timing")
            if self.error is not None:
                raise ValueError("an ok reply has no error")
        else:
            if self.usage is not None:
                raise ValueError(f"an {self.status} reply has no usage")
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
            wire["result"] = self.result.model_dump(exclude_none=True)
        if self.error is not None:
            wire["error"] = self.error.model_dump()
        wire["model"] = self.model.model_dump()
        wire["truncated"] = self.truncated
        wire["dedup"] = self.dedup
        if self.meta is not None:
            wire["meta"] = self.meta
        if self.timing is not None:
            wire["timing"] = self.timing.model_dump()
        if self.usage is not None:
            wire["usage"] = self.usage.model_dump()
        return wire


def result_from_map(result: Mapping[str, Any]) -> ResultModel:
    """The typed result for a contract ``result`` map (e.g. ``ItemOutcome.result``).

    ``embedding`` gives an ``EmbedResult``, ``chunks`` a ``ChunkedEmbedResult`` (1.3),
    ``scores`` as a list a ``RerankResult``,
    ``indices`` a ``SparseResult``, ``entities`` a ``TokenClassifyResult``; anything else is
    validated as a ``ClassifyResult`` (``{"label", "score", "scores"}``). Keys outside the
    contract (the runner's ``pooled``, ``tokens``) are ignored.

    Raises:
        pydantic.ValidationError: when the map is none of these shapes.
    """
    if "embedding" in result:
        return EmbedResult.model_validate(result)
    if "chunks" in result:
        return ChunkedEmbedResult.model_validate(result)
    if isinstance(result.get("scores"), list):
        return RerankResult.model_validate(result)
    if "indices" in result:
        return SparseResult.model_validate(result)
    if "entities" in result:
        return TokenClassifyResult.model_validate(result)
    return ClassifyResult.model_validate(result)


def _finite(value: object, minimum: float | None = None) -> float | None:
    """``value`` as a float when it is a finite int or float (not a bool) ≥ ``minimum``."""
    if type(value) is not float and type(value) is not int:
        return None
    number = float(value)
    if number - number != 0.0 or (minimum is not None and number < minimum):
        return None  # NaN or ±Infinity, or below the minimum
    return number


def _result_wire(result: Mapping[str, Any]) -> dict[str, Any] | None:
    """``result`` as ``EmbedResult``/``ClassifyResult.model_dump()`` would give it, or None.

    Keys other than the contract's (the runner's ``pooled`` array) are left out.
    """
    if "embedding" in result:
        embedding, dim = result["embedding"], result.get("dim")
        fmt = result.get("format", "float")
        if type(dim) is not int or dim < 1:
            return None
        if fmt != "float":
            size = embedding_bytes(fmt, dim) if type(fmt) is str else None
            if size is None or type(embedding) is not bytes or len(embedding) != size:
                return None
            return {"embedding": embedding, "dim": dim, "format": fmt}
        if type(embedding) is not list or dim != len(embedding):
            return None
        try:
            total = sum(embedding)  # finite sum ⇒ every value finite
        except TypeError:
            return None
        if _finite(total) is None and any(_finite(x) is None for x in embedding):
            return None  # a NaN/±Infinity (the sum alone can also overflow on finite values)
        return {"embedding": embedding, "dim": dim, "format": "float"}
    label, score, scores = result.get("label"), _finite(result.get("score")), result.get("scores")
    if type(label) is not str or score is None or type(scores) is not dict or label not in scores:
        return None
    clean: dict[str, float] = {}
    for name, value in scores.items():
        number = _finite(value)
        if type(name) is not str or number is None:
            return None
        clean[name] = number
    return {"label": label, "score": score, "scores": clean}


def reply_wire(
    status: Status,
    *,
    model: Mapping[str, Any],
    result: Mapping[str, Any] | None = None,
    error: tuple[ErrorCode, str] | None = None,
    truncated: bool = False,
    dedup: bool = False,
    meta: dict[str, Any] | None = None,
    timing: tuple[float, float, int, int] | None = None,
    usage_tokens: int | None = None,
) -> dict[str, Any] | None:
    """The wire form of a reply built by the server itself, without pydantic (~5 µs instead
    of ~25 µs): the dict ``Reply(...).to_wire()`` returns for the same arguments, or None when
    an argument is outside what these cheap checks can vouch for — then build the ``Reply``
    (which validates, and raises the precise error).

    Args:
        model: ``ModelInfo.model_dump()`` (trusted).
        result: the contract's result map (ok only); embedding values are trusted to be
            floats (``ItemOutcome.result``), their finiteness is checked.
        error: ``(code, message)`` (error and expired only).
        meta: the validated request's ``meta`` (trusted).
        timing: ``(queue_ms, infer_ms, batch_size, padded_len)`` (ok only).
        usage_tokens: ``usage.tokens`` (ok only; None leaves ``usage`` off).
    """
    wire: dict[str, Any] = {"v": CONTRACT_VERSION, "status": status}
    if status == "ok":
        if result is None or timing is None or error is not None:
            return None
        result_wire = _result_wire(result)
        if result_wire is None:
            return None
        wire["result"] = result_wire
    else:
        if status not in ("error", "expired") or error is None or result is not None:
            return None
        try:
            code = ErrorCode(error[0])
        except ValueError:
            return None
        if type(error[1]) is not str or (
            status == "expired" and code is not ErrorCode.DEADLINE_EXCEEDED
        ):
            return None
        wire["error"] = {"code": code.value, "message": error[1]}
        if usage_tokens is not None:
            return None
    if type(truncated) is not bool or type(dedup) is not bool:
        return None
    wire["model"] = model
    wire["truncated"] = truncated
    wire["dedup"] = dedup
    if meta is not None:
        wire["meta"] = meta
    if timing is not None:
        queue_ms, infer_ms = _finite(timing[0], 0.0), _finite(timing[1], 0.0)
        batch_size, padded_len = timing[2], timing[3]
        if (
            queue_ms is None
            or infer_ms is None
            or type(batch_size) is not int
            or type(padded_len) is not int
            or batch_size < 1
            or padded_len < 0
        ):
            return None
        wire["timing"] = {
            "queue_ms": queue_ms,
            "infer_ms": infer_ms,
            "batch_size": batch_size,
            "padded_len": padded_len,
        }
    if usage_tokens is not None:
        if type(usage_tokens) is not int or usage_tokens < 0:
            return None
        wire["usage"] = {"tokens": usage_tokens}
    return wire
