"""Outcomes → contract records: the one place that turns engine results into replies.

Pure (no I/O): builds :class:`schemas.records.OutRecord` values for the sink from
:class:`consumer.batching.types.ItemOutcome` and the parsed request (CONTRACT.md §Reply record,
§Dead letters). A dedup reply carries the result and timing of the computation that produced
it, with its own key, reply address, correlation id and ``meta`` — and its own embed options
(contract 1.1): each reply's ``result`` is shaped from the computation's full pooled vector for
the options its request asked for (:func:`consumer.options.shape_result`).

Replies are built by the server from its own values, so the serving path skips pydantic:
:func:`schemas.models.reply_wire` gives the wire form directly (about 5 µs instead of 25 µs per
reply, plus the encoding), with the same bytes; whatever it cannot vouch for goes through
:class:`schemas.models.Reply`, which validates and raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from consumer.batching.types import ItemOutcome
from consumer.kafka.records import InRecord
from consumer.options import EmbedOptions, ModelProfile, shape_result
from consumer.replies.chunking import CHUNKS, shape_chunks
from consumer.replies.task_options import NEW_TASKS, TaskOptions, shape_task_result
from schemas.errors import ErrorCode
from schemas.models import (
    ChunkOutput,
    ErrorInfo,
    ModelInfo,
    Reply,
    Status,
    Timing,
    Usage,
    reply_wire,
    result_from_map,
)
from schemas.records import (
    OutRecord,
    ParsedRequest,
    RecordDecodeError,
    build_dead_letter,
    build_error_reply,
    reply_record,
)


class ReplyBuilder:
    """Builds replies and dead letters for one served model and one dead-letter topic.

    ``profile`` is what the model offers the embed options (default: an embedder of unknown
    dimension without prompts or normalisation).
    """

    _NO_OPTIONS = EmbedOptions()

    def __init__(
        self, model: ModelInfo, dlq_topic: str, profile: ModelProfile | None = None
    ) -> None:
        self.model = model
        self.profile = profile if profile is not None else ModelProfile()
        self._model_wire = model.model_dump()
        self._dlq_topic = dlq_topic
        # Contract 1.2's results are shaped per request from the runner's (task_options).
        self._shapes_task = self.profile.task in NEW_TASKS

    def with_dlq_topic(self, dlq_topic: str) -> ReplyBuilder:
        """The same model's builder, dead-lettering to ``dlq_topic`` (a backfill job's own)."""
        if dlq_topic == self._dlq_topic:
            return self
        return ReplyBuilder(self.model, dlq_topic, self.profile)

    def _record(self, parsed: ParsedRequest, wire: dict[str, Any]) -> OutRecord:
        return reply_record(wire, key=parsed.key, address=parsed.address, encoding=parsed.encoding)

    def from_outcome(
        self, parsed: ParsedRequest, outcome: ItemOutcome, *, dedup: bool
    ) -> OutRecord:
        """The reply to ``parsed`` carrying ``outcome`` (ok, error or expired).

        Raises:
            pydantic.ValidationError: the outcome cannot make a contract reply (e.g. a NaN in
                the result).
            EncodeError: the reply cannot be encoded (e.g. an embedding value beyond float32).
        """
        request = parsed.request
        options = EmbedOptions.of(request) if request.has_embed_options else self._NO_OPTIONS
        if outcome.status == "ok" and outcome.result is not None and self._shapes_task:
            outcome = replace(
                outcome, result=dict(shape_task_result(outcome.result, TaskOptions.of(request)))
            )
            options = self._NO_OPTIONS
        elif outcome.status == "ok" and outcome.result is not None and CHUNKS in outcome.result:
            output = request.chunking.output if request.chunking is not None else "pooled"
            shaped = shape_chunks(outcome.result, options, output, self.profile)
            outcome = replace(outcome, result=dict(shaped))
            options = self._NO_OPTIONS
        return self._record(parsed, self._wire(outcome, dedup, request.meta, options))

    def _wire(
        self,
        outcome: ItemOutcome,
        dedup: bool,
        meta: dict[str, Any] | None,
        options: EmbedOptions,
    ) -> dict[str, Any]:
        if outcome.status == "ok":
            result: Mapping[str, Any] | None = outcome.result
            if result is not None and options is not self._NO_OPTIONS:
                result = shape_result(result, options, self.profile)
            wire = reply_wire(
                "ok",
                model=self._model_wire,
                result=result,
                truncated=outcome.truncated,
                dedup=dedup,
                meta=meta,
                timing=(
                    outcome.queue_ms,
                    outcome.infer_ms,
                    max(1, outcome.batch_size),
                    outcome.padded_len,
                ),
                usage_tokens=outcome.n_tokens,
            )
        else:
            code = ErrorCode(outcome.error_code or ErrorCode.INFERENCE_FAILED)
            wire = reply_wire(
                outcome.status,
                model=self._model_wire,
                error=(code, outcome.error_message or code.value),
                truncated=outcome.truncated,
                dedup=dedup,
                meta=meta,
            )
        if wire is None:
            return self.reply(outcome, dedup=dedup, meta=meta, options=options).to_wire()
        return wire

    def reply(
        self,
        outcome: ItemOutcome,
        *,
        dedup: bool = False,
        meta: dict[str, Any] | None = None,
        options: EmbedOptions | None = None,
        task_options: TaskOptions | None = None,
        chunk_output: ChunkOutput | None = None,
    ) -> Reply:
        """The contract's reply value for ``outcome`` (ok, error or expired), without a record
        around it (``kbatch backfill`` writes it to its own output records); ``options`` shape
        an embedding (:func:`consumer.options.shape_result`), ``task_options`` a 1.2 task's
        result (:func:`consumer.replies.task_options.shape_task_result`; default: no options),
        ``chunk_output`` a chunked embedding's (:func:`consumer.replies.chunking.shape_chunks`).

        Raises:
            ValueError: ``outcome.error_code`` is not a contract error code.
        """
        if outcome.status == "ok":
            result: Mapping[str, Any] | None = outcome.result
            if result is not None and self._shapes_task:
                result = shape_task_result(result, task_options or TaskOptions())
            elif result is not None and CHUNKS in result:  # contract 1.3 chunking
                result = shape_chunks(
                    result, options or self._NO_OPTIONS, chunk_output or "pooled", self.profile
                )
            elif result is not None and options is not None:
                result = shape_result(result, options, self.profile)
            return Reply(
                status="ok",
                result=None if result is None else result_from_map(result),
                model=self.model,
                truncated=outcome.truncated,
                dedup=dedup,
                meta=meta,
                timing=Timing(
                    queue_ms=outcome.queue_ms,
                    infer_ms=outcome.infer_ms,
                    batch_size=max(1, outcome.batch_size),
                    padded_len=outcome.padded_len,
                ),
                usage=Usage(tokens=outcome.n_tokens),
            )
        code = ErrorCode(outcome.error_code or ErrorCode.INFERENCE_FAILED)
        return Reply(
            status=outcome.status,
            error=ErrorInfo(code=code, message=outcome.error_message or code.value),
            model=self.model,
            truncated=outcome.truncated,
            dedup=dedup,
            meta=meta,
        )

    def _error_wire(
        self, status: Status, code: ErrorCode, message: str, meta: Any
    ) -> dict[str, Any]:
        wire = reply_wire(status, model=self._model_wire, error=(code, message), meta=meta)
        if wire is None:
            reply = Reply(
                status=status,
                error=ErrorInfo(code=code, message=message),
                model=self.model,
                meta=meta,
            )
            wire = reply.to_wire()
        return wire

    def error(self, parsed: ParsedRequest, code: ErrorCode, message: str) -> OutRecord:
        """An ``error`` reply to a well-formed request (e.g. ``unsupported_task``)."""
        return self._record(parsed, self._error_wire("error", code, message, parsed.request.meta))

    def expired(self, parsed: ParsedRequest, late_ms: int) -> OutRecord:
        """An ``expired`` reply: the deadline passed ``late_ms`` before the record was read."""
        message = f"deadline_ms passed {late_ms} ms before the request was read; not computed"
        wire = self._error_wire(
            "expired", ErrorCode.DEADLINE_EXCEEDED, message, parsed.request.meta
        )
        return self._record(parsed, wire)

    def decode_error_reply(self, err: RecordDecodeError) -> OutRecord:
        """The error reply to an addressable bad record (msgpack when its encoding is unknown)."""
        return build_error_reply(err, model=self.model)

    def dead_letter(self, record: InRecord, code: ErrorCode, message: str) -> OutRecord:
        """``record`` unchanged on the dead-letter topic, plus the ``kbatch.error.*`` and
        ``kbatch.source.*`` headers."""
        return build_dead_letter(
            record.key,
            record.value,
            record.headers,
            code,
            message,
            record.topic,
            record.partition,
            record.offset,
            self._dlq_topic,
        )
