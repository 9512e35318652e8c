"""Error codes of the wire contract and the one exception hierarchy of ``schemas/``.

::

    ContractError                 base of everything schemas/ raises; never retriable
     ├── DecodeError              bytes that are not a valid v1 value (request or reply);
     │    │                       .code: ErrorCode, .message: str, .meta: recovered request meta
     │    └── RecordDecodeError   a request record that cannot be served (parse_request_record);
     │                            adds what could be recovered to answer it: .key, .address,
     │                            .encoding, and .addressable / .reply_encoding
     └── EncodeError              a value the chosen encoding cannot carry (bytes in JSON, NaN)

Third-party errors (msgpack's ``ExtraData``/``StackError``/``ValueError``, ``json``'s
``JSONDecodeError``/``RecursionError``, pydantic's ``ValidationError``) are translated into these
at the codec boundary; nothing else escapes a decode function.

Messages are written for a person reading a reply or a dead letter: they name the field and the
rule and never echo the input itself (it may be large or hostile).
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar, Final

if TYPE_CHECKING:
    from schemas.codec import Encoding
    from schemas.records import ReplyAddress

__all__ = [
    "DEAD_LETTER_CODES",
    "ContractError",
    "DecodeError",
    "EncodeError",
    "ErrorCode",
    "RecordDecodeError",
]

MAX_MESSAGE_CHARS: Final = 1000
"""Messages are cut to this many characters (they travel in headers and replies)."""


class ErrorCode(StrEnum):
    """The error codes of CONTRACT.md §Reply record (``error.code``) and §Additions in 1.1
    (``invalid_option``)."""

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


DEAD_LETTER_CODES: Final[frozenset[ErrorCode]] = frozenset(
    {ErrorCode.INVALID_REQUEST, ErrorCode.UNSUPPORTED_VERSION}
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
        return (_rebuild_decode_error, (type(self), self.code, self.message, self.meta))


def _rebuild_decode_error(
    cls: type[DecodeError], code: ErrorCode, message: str, meta: dict[str, Any] | None
) -> DecodeError:
    return cls(code, message, meta=meta)


class RecordDecodeError(DecodeError):
    """A request record that cannot be served, with what was recovered to answer it anyway.

    Raised by ``schemas.records.parse_request_record``. The caller writes a dead letter
    (``build_dead_letter``) and, when ``addressable``, an error reply (``build_error_reply``).

    Attributes:
        key: the record key when non-empty, else None (an empty key counts as no key).
        address: the reply address as far as the headers could be read; a malformed header
            leaves its part None (configured reply topic / partition by key).
        encoding: the request's encoding, or None when ``content-type`` was unknown.
    """

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        key: bytes | None,
        address: ReplyAddress,
        encoding: Encoding | None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(code, message, meta=meta)
        self.key: bytes | None = key or None
        self.address: ReplyAddress = address
        self.encoding: Encoding | None = encoding

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_record_error,
            (self.code, self.message, self.key, self.address, self.encoding, self.meta),
        )

    @property
    def addressable(self) -> bool:
        """Whether the client can be answered: a non-empty key or a ``kafka_correlationId``.

        CONTRACT.md §Dead letters.
        """
        return self.key is not None or self.address.correlation_id is not None

    @property
    def reply_encoding(self) -> Encoding:
        """The encoding of the error reply: the request's, msgpack when it was unknown."""
        from schemas.codec import Encoding

        return self.encoding if self.encoding is not None else Encoding.MSGPACK


def _rebuild_record_error(
    code: ErrorCode,
    message: str,
    key: bytes | None,
    address: ReplyAddress,
    encoding: Encoding | None,
    meta: dict[str, Any] | None,
) -> RecordDecodeError:
    return RecordDecodeError(code, message, key=key, address=address, encoding=encoding, meta=meta)


class EncodeError(ContractError):
    """A value the chosen encoding cannot carry (e.g. bytes in JSON, a non-finite float)."""
