"""Outcomes → contract records: the one place that turns engine results into replies.

Pure (no I/O): builds :class:`schemas.records.OutRecord` values for the sink from
:class:`consumer.batching.types.ItemOutcome` and the parsed request (CONTRACT.md §Reply record,
§Dead letters). A dedup reply carries the result and timing of the computation that produced
it, with its own key, reply address, correlation id and ``meta``.
"""

from __future__ import annotations

from typing import Any

from consumer.batching.types import ItemOutcome
from consumer.kafka.records import InRecord
from schemas.errors import ErrorCode, RecordDecodeError
from schemas.models import ErrorInfo, ModelInfo, Reply, Timing, result_from_map
from schemas.records import (
    OutRecord,
    ParsedRequest,
    build_dead_letter,
    build_error_reply,
    build_reply_record,
)


class ReplyBuilder:
    """Builds replies and dead letters for one served model and one dead-letter topic."""

    def __init__(self, model: ModelInfo, dlq_topic: str) -> None:
        self.model = model
        self._dlq_topic = dlq_topic

    def _record(self, parsed: ParsedRequest, reply: Reply) -> OutRecord:
        return build_reply_record(
            reply, key=parsed.key, address=parsed.address, encoding=parsed.encoding
        )

    def from_outcome(
        self, parsed: ParsedRequest, outcome: ItemOutcome, *, dedup: bool
    ) -> OutRecord:
        """The reply to ``parsed`` carrying ``outcome`` (ok, error or expired)."""
        return self._record(parsed, self.reply(outcome, dedup=dedup, meta=parsed.request.meta))

    def reply(
        self, outcome: ItemOutcome, *, dedup: bool = False, meta: dict[str, Any] | None = None
    ) -> Reply:
        """The contract's reply value for ``outcome`` (ok, error or expired), without a record
        around it (``kbatch backfill`` writes it to its own output records).

        Raises:
            ValueError: ``outcome.error_code`` is not a contract error code.
        """
        if outcome.status == "ok":
            return Reply(
                status="ok",
                result=None if outcome.result is None else result_from_map(outcome.result),
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

    def error(self, parsed: ParsedRequest, code: ErrorCode, message: str) -> OutRecord:
        """An ``error`` reply to a well-formed request (e.g. ``unsupported_task``)."""
        reply = Reply(
            status="error",
            error=ErrorInfo(code=code, message=message),
            model=self.model,
            truncated=False,
            dedup=False,
            meta=parsed.request.meta,
        )
        return self._record(parsed, reply)

    def expired(self, parsed: ParsedRequest, late_ms: int) -> OutRecord:
        """An ``expired`` reply: the deadline passed ``late_ms`` before the record was read."""
        reply = Reply(
            status="expired",
            error=ErrorInfo(
                code=ErrorCode.DEADLINE_EXCEEDED,
                message=f"deadline_ms passed {late_ms} ms before the request was read; "
                "not computed",
            ),
            model=self.model,
            truncated=False,
            dedup=False,
            meta=parsed.request.meta,
        )
        return self._record(parsed, reply)

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
