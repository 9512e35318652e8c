"""The shared types of the batching layer (docs/internals.md §Shared types).

Pure dataclasses: no asyncio, no torch. Times are **monotonic seconds** (``time.monotonic``
or the injected clock); durations in outcomes are milliseconds, as the contract's ``timing``.

The four built once or more per request (``InferenceItem``, ``TokenizedItem``, ``ItemRun``,
``ItemOutcome``) are not ``frozen``: a frozen dataclass's ``__init__`` sets each field through
``object.__setattr__``, ~3× the cost (≈ 2.7 against 0.9 µs for ``ItemOutcome``'s 12 fields,
≈ 5 µs per request for the four). They are read-only all the same: nothing changes one after
it is built.

::

    InferenceItem ──tokenize──► TokenizedItem ──BucketBatcher──► Batch ──runner──► ItemRun
          │                         (or Rejected: input_too_long)                    │
          └──────────────────────────────────────► ItemOutcome ◄─────────────────────┘
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Literal

from schemas.errors import ErrorCode

OutcomeStatus = Literal["ok", "error", "expired"]
"""The contract's reply ``status`` (CONTRACT.md §Reply record)."""

Lane = Literal["live", "bulk"]
"""Which kind of work an item is: ``live`` requests (a client waits for the reply)
go first; ``bulk`` work (backfill jobs, requests marked ``priority: bulk``) uses the capacity
live work leaves idle."""


@dataclass(slots=True)
class InferenceItem:
    """One request as the engine sees it.

    Attributes:
        item_id: the caller's id, unique among items in flight; echoed in the outcome.
        text: the input text (any length; the tokenizer cuts it).
        truncate: the request's ``truncate`` flag; ``None`` = the server's policy.
        arrival_s: monotonic seconds when the request arrived (the batching clock's epoch:
            a bucket's deadline is its oldest item's ``arrival_s + max_wait_ms``).
        deadline_s: monotonic seconds after which the answer is useless (``expired``,
            never computed); ``None`` = no deadline.
        group: an opaque tag (the pipeline uses ``(topic, partition)``) for
            ``Engine.cancel_group``; ``None`` = no group.
        documents: rerank (contract 1.2): the documents ``text`` (the query) is scored
            against; :class:`consumer.batching.fanout.FanOutEngine` makes one item of each
            (query, document) pair, so each pair is one sequence for buckets and the budget.
        text_pair: the second sequence of a pair item (a cross-encoder's document): tokenized
            as ``(text, text_pair)``, truncated longest-first.
        lane: ``live`` (default) or ``bulk`` (see :data:`Lane`).
        windows: contract 1.3: :class:`consumer.batching.fanout.FanOutEngine` splits the text
            into overlapping windows (:class:`Window`) when it is longer than one, each window
            one sequence; False: one sequence, cut or refused by ``truncate``.
        window: set on one window of a split item (by the fan-out), else None.
        chunking: embed (contract 1.3): how to chunk ``text`` (:class:`ChunkPlan`); the
            fan-out's windower makes one item per chunk.
        trace: the request's span under ``--tracing`` (opaque here; a fan-out's parts keep
            it), read by the engine's batch observer (:mod:`consumer.tracing.batches`);
            None without tracing.
    """

    item_id: int
    text: str
    truncate: bool | None = None
    arrival_s: float = 0.0
    deadline_s: float | None = None
    group: Hashable | None = None
    documents: tuple[str, ...] | None = None
    text_pair: str | None = None
    lane: Lane = "live"
    windows: bool = False
    window: Window | None = None
    chunking: ChunkPlan | None = None
    trace: object | None = None


@dataclass(slots=True)
class TokenAlignment:
    """Where each token of an item lies in its text (token-classify, contract 1.2).

    Attributes:
        offsets: ``(start, end)`` character span of each token in the item's text (code points;
            ``(0, 0)`` for special tokens).
        special: whether each token is a special token (``[CLS]``, ``[SEP]``).
        is_subword: whether each token continues the previous word (the transformers
            token-classification pipeline's rule: a ``##``-style continuing-subword prefix
            where the vocabulary has one, else no space before the token).
    """

    offsets: list[tuple[int, int]]
    special: list[bool]
    is_subword: list[bool]


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    """How an embed request's text is chunked (contract 1.3, ``chunking``).

    Attributes:
        max_tokens: tokens per chunk at most, special tokens and prompt included; None: the
            model's maximum length.
        overlap: tokens consecutive chunks share (about: chunks start at word starts).
        prompt: the prompt put in front of every chunk (the text itself has none).
    """

    max_tokens: int | None
    overlap: int
    prompt: str = ""


@dataclass(slots=True)
class Window:
    """One window of a text longer than the model's maximum length (contract 1.3).

    Attributes:
        index: 0-based position among the text's windows.
        count: how many windows the text has.
        input_ids: the window's token ids, special tokens included (at most the model's
            maximum length): the tokenizer's overflow windows, as transformers'
            ``return_overflowing_tokens=True, stride=…``; the engine does not tokenize again.
            None: the item's text (a rerank pair: ``text_pair``, the window's characters)
            is tokenized as any item.
        alignment: the window's tokens' spans in the whole text (token-classify).
        document: rerank: the index of the document the window belongs to.
        start / end: rerank: the window's span in its document, in characters.
    """

    index: int
    count: int
    input_ids: list[int] | None
    alignment: TokenAlignment | None = None
    document: int = 0
    start: int = 0
    end: int = 0


@dataclass(slots=True)
class TokenizedItem:
    """An item with its token ids.

    Attributes:
        item: the request.
        input_ids: token ids including special tokens, at most the model's max length.
        n_tokens: ``len(input_ids)`` (special tokens included).
        truncated: whether the input was cut to the model's maximum length.
    """

    item: InferenceItem
    input_ids: list[int]
    n_tokens: int
    truncated: bool
    type_ids: list[int] | None = None
    """Segment ids of a pair item (``text_pair``); None: all zero."""
    alignment: TokenAlignment | None = None
    """Token spans for token-classify; None for the other tasks."""


@dataclass(frozen=True, slots=True)
class Rejected:
    """An item the tokenizer refused (``input_too_long`` when ``truncate`` is false).

    Attributes:
        item: the request.
        n_tokens: its length in tokens (at least the model's max length + 1; a lower bound
            when the character pre-limit cut the text before tokenizing).
        error_code: the contract's error code.
        error_message: a human-readable reason (never echoes the text).
    """

    item: InferenceItem
    n_tokens: int
    error_code: ErrorCode
    error_message: str


@dataclass(slots=True)
class Batch:
    """Items that run together, padded to ``padded_len`` tokens.

    Attributes:
        items: the batch, sorted by ``n_tokens`` descending (the policy's order).
        padded_len: ``max(n_tokens)`` of the items: every row is padded to it.
        formed_s: monotonic seconds when the policy formed the batch.
        bucket: index of the bucket it came from (for stats; -1 when unknown).
    """

    items: list[TokenizedItem]
    padded_len: int
    formed_s: float
    bucket: int = -1

    @property
    def padded_tokens(self) -> int:
        """``padded_len × len(items)``: the tokens the model computes."""
        return self.padded_len * len(self.items)

    @property
    def real_tokens(self) -> int:
        """Sum of the items' ``n_tokens``."""
        return sum(t.n_tokens for t in self.items)


@dataclass(slots=True)
class ItemRun:
    """What the runner answers for one item of a batch (aligned with ``Batch.items``).

    ``result`` is set on success, else ``error_code``/``error_message``. ``infer_ms``,
    ``batch_size`` and ``padded_len`` describe the (sub-)batch that finally computed it:
    after a failure split they are the half's, not the original batch's.
    """

    result: dict[str, Any] | None
    error_code: ErrorCode | None = None
    error_message: str | None = None
    infer_ms: float = 0.0
    batch_size: int = 0
    padded_len: int = 0


@dataclass(slots=True)
class ItemOutcome:
    """The engine's answer for one submitted item (passed to ``on_outcomes``).

    Attributes:
        item_id: the item's id.
        status: ``ok``, ``error`` or ``expired``.
        result: the contract's ``result`` map when ok (embed: ``{"embedding": list[float],
            "dim": int}``; classify: ``{"label": str, "score": float, "scores": {label:
            float}}``), else None.
        error_code / error_message: set for ``error`` and ``expired``.
        truncated: whether the input was cut to the model's maximum length.
        n_tokens: the item's tokens (special tokens included).
        queue_ms: arrival to the start of its batch's compute (or to the expiry decision).
        infer_ms: model time of the batch that computed it (0 when not computed).
        batch_size / padded_len: that batch's shape (0 when not computed).
        group: the item's group tag, for the caller's bookkeeping.
    """

    item_id: int
    status: OutcomeStatus
    result: dict[str, Any] | None
    error_code: str | None
    error_message: str | None
    truncated: bool
    n_tokens: int
    queue_ms: float
    infer_ms: float
    batch_size: int
    padded_len: int
    group: Hashable | None = field(default=None, compare=False)
