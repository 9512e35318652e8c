"""Long texts in overlapping windows (contract 1.3), split off the event loop.

:class:`TokenWindows` is the splitter :class:`consumer.batching.fanout.FanOutEngine` calls (in a
worker thread) for items with ``windows`` set: the text is tokenized once, with the model's
fast tokenizer truncating to ``max_length`` with ``stride`` and returning the overflow — exactly
what transformers' ``tokenizer(text, truncation=True, return_overflowing_tokens=True,
stride=stride)`` does, and so what ``pipeline("token-classification", stride=stride)`` runs
the model on. Window ``k`` holds content tokens ``[k × step, k × step + width)`` with
``width = max_length − special tokens`` and ``step = width − stride``, plus the special
tokens; consecutive windows share ``stride`` tokens. A window may end (and the next begin) in
the middle of a word: the pipeline's windows do too.

Each window becomes one item (:class:`~consumer.batching.types.Window`: ids and the tokens'
spans in the whole text), so the engine buckets, budgets and batches it as any sequence and
does not tokenize it again. A text that fits one window is one window.

Caps: a text of more than ``max_windows`` windows is refused ``input_too_long`` (whatever
``truncate`` says: windows exist so that nothing is cut), and so is a text longer than the
character pre-limit (``16`` characters per token of the ``max_windows`` windows; no word-piece
tokenizer packs more), which is never tokenized whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from tokenizers import Tokenizer

from consumer.batching.fanout import FanOutEngine
from consumer.batching.routes import OutcomeCallback
from consumer.batching.types import InferenceItem, Rejected, Window
from consumer.model.tokenize import HFTokenizer
from schemas.errors import ErrorCode
from schemas.models import Task

__all__ = [
    "DEFAULT_MAX_WINDOWS",
    "ChunkWindows",
    "PairWindows",
    "TokenWindows",
    "default_stride",
    "fan_out_for",
]

DEFAULT_MAX_WINDOWS = 64
"""Windows per request at most (``--max-windows``): 64 × 512 tokens ≈ 150 pages of English."""


def _copy(tokenizer: HFTokenizer) -> Tokenizer:
    """A private copy of ``tokenizer``'s fast tokenizer: no padding, no truncation."""
    copy = Tokenizer.from_str(tokenizer.backend_json)
    copy.no_padding()
    copy.no_truncation()
    return copy


def default_stride(width: int) -> int:
    """The default overlap in tokens for windows of ``width`` content tokens: one eighth
    (63 for a 512-token BERT, whose windows hold 510)."""
    return max(0, width // 8)


class TokenWindows:
    """Splits items into windows (see the module docstring).

    Args:
        tokenizer: the engine's tokenizer (its vocabulary, ``max_length`` and alignment rule).
        stride: tokens shared by consecutive windows, ``0 ≤ stride < width``; None:
            :func:`default_stride`.
        max_windows: windows per text at most; more is ``input_too_long``.

    Raises:
        ValueError: ``stride`` out of range, or ``max_windows`` < 1.

    Thread-safety: :meth:`split` may be called from one worker thread at a time.
    """

    def __init__(
        self,
        tokenizer: HFTokenizer,
        *,
        stride: int | None = None,
        max_windows: int = DEFAULT_MAX_WINDOWS,
    ) -> None:
        self._tokenizer = tokenizer
        self._split = _copy(tokenizer)
        self.max_length = tokenizer.max_length
        specials = self._split.post_processor.num_special_tokens_to_add(False)
        self.width = self.max_length - specials
        self.stride = default_stride(self.width) if stride is None else stride
        if not 0 <= self.stride < self.width:
            raise ValueError(
                f"window stride must be in 0..{self.width - 1} (a window holds {self.width} "
                f"tokens besides the special ones), got {self.stride}"
            )
        if max_windows < 1:
            raise ValueError(f"max_windows must be >= 1, got {max_windows}")
        self.max_windows = max_windows
        self.step = self.width - self.stride
        self.max_chars = 16 * (max_windows * self.step + self.stride + specials)
        self._split.enable_truncation(max_length=self.max_length, stride=self.stride)

    def split(self, items: Sequence[InferenceItem]) -> list[list[InferenceItem] | Rejected]:
        """Each item's windows (items in order; each window a copy of the item with
        ``window`` set and ``windows`` False), or ``input_too_long`` over the caps."""
        out: list[list[InferenceItem] | Rejected] = []
        texts = [it.text[: self.max_chars] for it in items]
        encodings = self._split.encode_batch(texts) if texts else []
        for item, enc in zip(items, encodings, strict=True):
            parts = [enc, *enc.overflowing]
            if len(parts) > self.max_windows or len(item.text) > self.max_chars:
                out.append(self._too_long(item, len(parts)))
                continue
            align = self._tokenizer.alignment
            out.append(
                [
                    replace(
                        item,
                        windows=False,
                        window=Window(
                            index,
                            len(parts),
                            list(part.ids),
                            self._tokenizer.align(item.text, part) if align else None,
                        ),
                    )
                    for index, part in enumerate(parts)
                ]
            )
        return out

    def _too_long(self, item: InferenceItem, n_windows: int) -> Rejected:
        if len(item.text) > self.max_chars:
            why = f"more than {self.max_chars} characters"
        else:
            why = f"{n_windows} windows of {self.max_length} tokens (stride {self.stride})"
        return Rejected(
            item,
            n_tokens=self.max_windows * self.step + self.stride + 1,
            error_code=ErrorCode.INPUT_TOO_LONG,
            error_message=f"input has {why}; at most {self.max_windows} windows per request",
        )


def fan_out_for(
    task: Task,
    tokenizer: Any,
    engine: Any,
    on_outcomes: OutcomeCallback | None = None,
    *,
    stride: int | None = None,
    max_windows: int = DEFAULT_MAX_WINDOWS,
) -> FanOutEngine | None:
    """The fan-out serve and backfill put in front of the engine, or None when ``task`` needs
    none: rerank (pairs; document windows, :class:`PairWindows`), token-classify (windows,
    :class:`TokenWindows`) and embed (chunks, :class:`ChunkWindows`; requests without
    ``chunking`` pass through untouched) — windows when ``tokenizer`` is an
    :class:`~consumer.model.tokenize.HFTokenizer`; without one (the ``noop`` and ``sim:``
    models) an embed request's ``chunking`` is answered ``invalid_option``. ``engine`` and
    ``on_outcomes`` (the default callback) are :class:`FanOutEngine`'s.

    Raises:
        ValueError: ``stride`` or ``max_windows`` out of range (:class:`TokenWindows`).
    """
    hf = isinstance(tokenizer, HFTokenizer)
    if task == "rerank":
        if not hf:
            return FanOutEngine(engine, on_outcomes)
        pairs = PairWindows(tokenizer, stride=stride, max_windows=max_windows)
        return FanOutEngine(engine, on_outcomes, windower=pairs)
    if task == "embed":  # without a tokenizer (noop, sim) chunking is refused
        chunks = ChunkWindows(tokenizer, max_windows=max_windows) if hf else None
        return FanOutEngine(engine, on_outcomes, windower=chunks)
    if task == "token-classify" and isinstance(tokenizer, HFTokenizer):
        windows = TokenWindows(tokenizer, stride=stride, max_windows=max_windows)
        return FanOutEngine(engine, on_outcomes, windower=windows)
    return None


class PairWindows:
    """Splits rerank items into (query, document window) pairs (contract 1.3, MaxP).

    A document whose pair fits ``max_length`` is one pair, as in 1.2. A longer one is cut
    into windows of whole words of at most ``width = max_length − pair special tokens −
    min(query tokens, max_length // 2)`` tokens, consecutive windows sharing about
    ``min(stride, width // 2)`` tokens (moved back to a word's start): each window is the
    document's characters ``[start, end)`` and one pair ``(query, document[start:end])``,
    tokenized by the engine as any pair — so its score is ``CrossEncoder.predict`` of that
    pair. Windows start at word starts because a word's pieces depend on the word's start.

    Args:
        tokenizer: the engine's tokenizer.
        stride: the overlap in tokens (as :class:`TokenWindows`; None: :func:`default_stride`).
        max_windows: windows per document at most; more is ``input_too_long``.
    """

    def __init__(
        self,
        tokenizer: HFTokenizer,
        *,
        stride: int | None = None,
        max_windows: int = DEFAULT_MAX_WINDOWS,
    ) -> None:
        self._plain = _copy(tokenizer)
        self.max_length = tokenizer.max_length
        self._specials = self._plain.post_processor.num_special_tokens_to_add(True)
        single = self._plain.post_processor.num_special_tokens_to_add(False)
        self.stride = default_stride(self.max_length - single) if stride is None else stride
        if max_windows < 1:
            raise ValueError(f"max_windows must be >= 1, got {max_windows}")
        self.max_windows = max_windows

    def split(self, items: Sequence[InferenceItem]) -> list[list[InferenceItem] | Rejected]:
        """Each rerank item's pairs (``window`` set: document index, span) or its
        ``input_too_long``; an item without documents is one item, unchanged."""
        return [self._item(it) for it in items]

    def _item(self, item: InferenceItem) -> list[InferenceItem] | Rejected:
        docs = item.documents or ()
        if not docs:
            return [replace(item, windows=False)]
        query, *encodings = self._plain.encode_batch([item.text, *docs], add_special_tokens=False)
        q = len(query.ids)
        width = self.max_length - self._specials - min(q, self.max_length // 2)
        pairs: list[InferenceItem] = []
        for d, (doc, enc) in enumerate(zip(docs, encodings, strict=True)):
            if q + len(enc.ids) + self._specials <= self.max_length or width < 2:
                spans = [(0, len(doc))]
            else:
                spans = _word_windows(enc, width, min(self.stride, width // 2))
            if len(spans) > self.max_windows:
                return Rejected(
                    item,
                    n_tokens=q + len(enc.ids) + self._specials,
                    error_code=ErrorCode.INPUT_TOO_LONG,
                    error_message=f"document {d} has {len(spans)} windows of {width} tokens; "
                    f"at most {self.max_windows} windows per document",
                )
            for k, (start, end) in enumerate(spans):
                window = Window(k, len(spans), None, None, d, start, end)
                pair = doc if len(spans) == 1 else doc[start:end]
                pairs.append(
                    replace(item, documents=None, text_pair=pair, windows=False, window=window)
                )
        return pairs


class ChunkWindows:
    """Splits embed items with ``chunking`` into chunks (contract 1.3).

    A text of at most ``width = max_tokens − special tokens − prompt tokens`` tokens is one
    chunk (the whole text); a longer one is cut into windows of whole words of at most
    ``width`` tokens, consecutive ones sharing about ``overlap`` tokens. Each chunk is one
    item ``prompt + text[start:end]``, tokenized by the engine as any text, so its vector is
    sentence-transformers' ``encode`` of that chunk's text (with the prompt).

    Args:
        tokenizer: the engine's tokenizer.
        max_windows: chunks per text at most; more is ``input_too_long``.
    """

    def __init__(self, tokenizer: HFTokenizer, *, max_windows: int = DEFAULT_MAX_WINDOWS) -> None:
        self._plain = _copy(tokenizer)
        self.max_length = tokenizer.max_length
        self._specials = self._plain.post_processor.num_special_tokens_to_add(False)
        self.max_windows = max_windows

    def split(self, items: Sequence[InferenceItem]) -> list[list[InferenceItem] | Rejected]:
        """Each item's chunks (``window`` set: span in the text), or its rejection:
        ``invalid_option`` for a ``max_tokens`` over the model's maximum or leaving no room
        for text after the prompt, or an ``overlap`` of a whole chunk; ``input_too_long``
        over ``max_windows``. An item without ``chunking`` is one item, unchanged."""
        return [self._item(it) for it in items]

    def _item(self, item: InferenceItem) -> list[InferenceItem] | Rejected:
        plan = item.chunking
        if plan is None:
            return [replace(item, windows=False)]
        max_tokens = plan.max_tokens or self.max_length
        prompt = len(self._plain.encode(plan.prompt, add_special_tokens=False).ids)
        width = max_tokens - self._specials - prompt
        problem = None
        if max_tokens > self.max_length:
            problem = f"chunking.max_tokens {max_tokens} is over the model's {self.max_length}"
        elif width < 1:
            problem = f"chunking.max_tokens {max_tokens} leaves no token for text after the "
            problem += f"{self._specials} special and {prompt} prompt tokens"
        elif plan.overlap >= width:
            problem = f"chunking.overlap {plan.overlap} must be below a chunk's {width} tokens"
        if problem is not None:
            return Rejected(item, 0, ErrorCode.INVALID_OPTION, problem)
        enc = self._plain.encode(item.text, add_special_tokens=False)
        if len(enc.ids) <= width:
            spans = [(0, len(item.text))]
        else:
            spans = _word_windows(enc, width, plan.overlap)
        if len(spans) > self.max_windows:
            return Rejected(
                item,
                n_tokens=len(enc.ids) + self._specials,
                error_code=ErrorCode.INPUT_TOO_LONG,
                error_message=f"input makes {len(spans)} chunks of {max_tokens} tokens; "
                f"at most {self.max_windows} per request",
            )
        return [
            replace(
                item,
                text=plan.prompt + item.text[start:end],
                windows=False,
                chunking=None,
                window=Window(k, len(spans), None, None, 0, start, end),
            )
            for k, (start, end) in enumerate(spans)
        ]


def _word_windows(enc: Any, width: int, overlap: int) -> list[tuple[int, int]]:
    """Character spans of windows of at most ``width`` of ``enc``'s tokens, each starting at
    a word's first token, consecutive ones sharing about ``overlap`` tokens; a word longer
    than ``width`` tokens is cut where the window ends."""
    words: list[int | None] = list(enc.word_ids)
    offsets: list[tuple[int, int]] = list(enc.offsets)
    n = len(words)

    def inside_word(i: int) -> bool:
        return 0 < i < n and words[i] is not None and words[i] == words[i - 1]

    spans: list[tuple[int, int]] = []
    a = 0
    while True:
        b = min(a + width, n)
        c = b
        while c > a + 1 and inside_word(c):
            c -= 1
        if c > a + 1 or not inside_word(b):
            b = c
        spans.append((offsets[a][0], offsets[b - 1][1]))
        if b >= n:
            return spans
        nxt = max(b - overlap, a + 1)
        while nxt > a + 1 and inside_word(nxt):
            nxt -= 1
        a = nxt
