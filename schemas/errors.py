"""Error codes of the wire contract and the one exception hierarchy of ``schemas/``.

::

    ContractError                 base of everything schemas/ raises; never retriable
     ├── DecodeError              bytes that are not a valid v1 value (request or reply);
     │    │                       .code: ErrorCode, .message: str, .meta: recovered request meta
     │    └── RecordDecodeError   a request record that cannot be served (parse_request_record);
     │                            adds what could be recovered to answer it: .key, .address,
     │                            .encoding, and .addressable / .reply_encoding. Defined in
     │                            schemas.records, next to the ReplyAddress it carries
     └── EncodeError              a value the chosen encoding cannot carry (bytes in JSON, NaN)

Third-party errors (msgpack's ``ExtraData``/``StackError``/``ValueError``, ``json``'s
``JSONDecodeError``/``RecursionError``, pydantic's ``ValidationError``) are translated into these
at the codec boundary; nothing else escapes a decode function.

This module imports nothing of ``schemas/``: the codec, the models and the records import it
(no import circle; ``tests/unit/test_import_graph.py``).

Messages are written for a person reading a reply or a dead letter: they name the field and the
rule and never echo the input itself (it may be large or hostile).
"""

from __future__ import annotations

from enum import StrEnum
from functools import partial
from typing import Any, ClassVar, Final

__all__ = ["DEAD_LETTER_CODES", "ContractError", "DecodeError", "EncodeError", "ErrorCode"]

MAX_MESSAGE_CHARS: Final = 1000
"""Messages are cut to this many characters (they travel in headers and replies)."""


class ErrorCode(StrEnum):
    """The error codes of CONTRACT.md §Error codes (``error.code``); ``invalid_option`` since
    1.1, ``idempotency_key_reused`` since 1.4."""

    INVALID_REQUEST = "invalid_request"
    """Undecodable value, wrong or missing field, bad header, no key (a dead letter)."""
    UNSUPPORTED_TASK = "unsupported_task"
    """``task`` names the other task than the served model's."""
    UNSUPPORTED_VERSION = "unsupported_version"
    """``v`` is an integer other than 1 (a dead letter)."""
    INPUT_TOO_LONG = "input_too_long"
    """More tokens than the model's maximum length and ``truncate: false``."""
    DEADLINE_EXCEEDED = "deadline_exceeded"
    """``deadline_ms`` passed before compute (status ``expired``)."""
    INFERENCE_FAILED = "inference_failed"
    """The model raised while computing this request's batch."""
    INVALID_OPTION = "invalid_option"
    """A well-formed request asks for what this model cannot do (``dimensions`` above its
    dimension, an unknown ``prompt_name``, an embed option on a classify model); not a dead
    letter (contract 1.1)."""
    REPLY_TOPIC_NOT_ALLOWED = "reply_topic_not_allowed"
    """``kafka_replyTopic`` names a topic kbatch may not reply to: outside the operator's
    ``--allowed-reply-topics``, the request or dead-letter topic, an internal ``__*`` topic, or
    one the broker's ACLs refuse kbatch's principal (a dead letter; nothing is written there)."""
    IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused"
    """The key is in flight or answered within the dedup window for another input (``text``;
    rerank: query and documents): the copy gets this error, not the other input's result; not a
    dead letter (contract 1.4)."""


DEAD_LETTER_CODES: Final[frozenset[ErrorCode]] = frozenset(
    {ErrorCode.INVALID_REQUEST, ErrorCode.UNSUPPORTED_VERSION, ErrorCode.REPLY_TOPIC_NOT_ALLOWED}
)
"""Codes whose record goes to the dead-letter topic (CONTRACT.md §Dead letters)."""


def _clip(message: str) -> str:
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    return message[: MAX_MESSAGE_CHARS - 1] + "…"


class ContractError(Exception):
    """Base of every error about the wire contract. Never retriable: the same bytes fail again."""

    retriable: ClassVar[bool] = False


class DecodeError(ContractError):
    """Bytes that are not a valid v1 value.

    Attributes:
        code: the contract's error code for the reply / dead letter.
        message: a human-readable reason (at most ``MAX_MESSAGE_CHARS`` characters).
        meta: the request's ``meta`` when the value was a map whose ``meta`` itself was valid,
            so that the error reply can still echo it (CONTRACT.md §Request record, ``meta``);
            else None.
    """

    def __init__(
        self, code: ErrorCode, message: str, *, meta: dict[str, Any] | None = None
    ) -> None:
        self.code: ErrorCode = ErrorCode(code)
        self.message: str = _clip(message)
        self.meta: dict[str, Any] | None = meta
        super().__init__(f"{self.code}: {self.message}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled (a process pool's result) as a call: the keyword-only fields in a partial.
        return (partial(type(self), meta=self.meta), (self.code, self.message))


class EncodeError(ContractError):
    """A value the chosen encoding cannot carry (e.g. bytes in JSON, a non-finite float)."""
