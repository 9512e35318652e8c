"""Tokenization with the model's fast (Rust) tokenizer, one poll chunk per call.

The engine calls :meth:`HFTokenizer.tokenize` in a worker thread, so the event loop never
tokenizes. Lengths include special tokens (``[CLS] … [SEP]``). Over-length policy per item:
``truncate`` true (or None with the default policy) cuts to ``max_length`` and reports
``truncated``; false rejects with ``input_too_long`` (CONTRACT.md §Request record).

A character pre-limit (default ``16 × max_length`` characters) bounds the work for huge
inputs: a 1 MiB text is never tokenized whole. A text cut by it is over-length (no
word-piece tokenizer packs 16 characters per token on average) — truncated or rejected.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer
from transformers import AutoTokenizer

from consumer.batching.types import InferenceItem, Rejected, TokenAlignment, TokenizedItem
from consumer.model.limits import read_max_length
from schemas.errors import ErrorCode

__all__ = ["HFTokenizer", "WordCountTokenizer", "read_max_length"]

Input = str | tuple[str, str]
"""A text, or a (text, text_pair) pair (a cross-encoder's query and document)."""


def _encode_batch(tokenizer: Tokenizer, texts: list[Input], offsets: bool = False) -> list[Any]:
    """``encode_batch_fast`` (tokenizers ≥ 0.21: the same ids, no character offsets; ~25 %
    less CPU) where the installed tokenizers has it and no ``offsets`` are needed, else
    ``encode_batch``."""
    fast = None if offsets else getattr(tokenizer, "encode_batch_fast", None)
    return list(fast(texts) if fast is not None else tokenizer.encode_batch(texts))


def _input(item: InferenceItem, max_chars: int) -> Input:
    """The item's text (and pair), each cut to the character pre-limit."""
    if item.text_pair is None:
        return item.text[:max_chars]
    return (item.text[:max_chars], item.text_pair[:max_chars])


def _longer_than(item: InferenceItem, max_chars: int) -> bool:
    return len(item.text) > max_chars or (
        item.text_pair is not None and len(item.text_pair) > max_chars
    )


def _too_long(item: InferenceItem, n_tokens: int, why: str, max_length: int) -> Rejected:
    """The ``input_too_long`` answer for an over-length item that may not be truncated."""
    return Rejected(
        item,
        n_tokens=n_tokens,
        error_code=ErrorCode.INPUT_TOO_LONG,
        error_message=(
            f"input has {why}; the model's maximum is {max_length} tokens "
            "and the request set truncate=false"
        ),
    )


def _split(item: InferenceItem) -> bool:
    """Whether ``item`` is a window split into ids already."""
    return item.window is not None and item.window.input_ids is not None


def _windowed(item: InferenceItem) -> TokenizedItem:
    """A window of a long text (:class:`~consumer.batching.types.Window`): its ids as split."""
    window = item.window
    assert window is not None and window.input_ids is not None
    ids = window.input_ids
    return TokenizedItem(item, ids, len(ids), False, None, window.alignment)


class HFTokenizer:
    """The model's fast tokenizer, with the over-length policy and a character pre-limit.

    Args:
        model_dir: a directory ``AutoTokenizer`` can load (a fast tokenizer is required).
        max_length: maximum tokens per item; default :func:`read_max_length`.
        truncate_by_default: the server's policy for items whose ``truncate`` is None.
        max_chars: the character pre-limit; default ``16 × max_length``.
        alignment: also record each token's character span (:class:`TokenAlignment`,
            token-classify): the slower ``encode_batch`` with offsets.

    Pair items (``text_pair`` set, rerank) are tokenized as ``(text, text_pair)`` with their
    segment ids; truncation cuts the longer of the two first (``longest_first``, as
    transformers' tokenizers and sentence-transformers' ``CrossEncoder`` do).

    Raises:
        ValueError: when only a slow (Python) tokenizer is available.

    Thread-safety: :meth:`tokenize` may be called from one worker thread at a time.
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        max_length: int | None = None,
        truncate_by_default: bool = True,
        max_chars: int | None = None,
        alignment: bool = False,
    ) -> None:
        path = Path(model_dir)
        self.alignment = alignment
        hf = AutoTokenizer.from_pretrained(str(path), use_fast=True)
        backend = getattr(hf, "backend_tokenizer", None)
        if not isinstance(backend, Tokenizer):
            raise ValueError(f"{path}: no fast tokenizer (tokenizer.json) available")
        self.max_length: int = max_length or read_max_length(path)
        self.truncate_by_default = truncate_by_default
        self.max_chars: int = max_chars or 16 * self.max_length
        pad_id = hf.pad_token_id
        self.pad_token_id: int = int(pad_id) if pad_id is not None else 0
        # Two private copies: one never truncates (to measure), one truncates to max_length
        # (the post-processor re-adds [SEP] after the cut).
        self._full = Tokenizer.from_str(backend.to_str())
        self._full.no_truncation()
        self._full.no_padding()
        self._cut = Tokenizer.from_str(backend.to_str())
        self._cut.no_padding()
        self._cut.enable_truncation(max_length=self.max_length)
        self._unk_id = hf.unk_token_id
        self.backend_json: str = backend.to_str()
        """The fast tokenizer's JSON, for :class:`consumer.model.windows.TokenWindows`."""
        model = self._full.model
        self._subword_prefix = bool(getattr(model, "continuing_subword_prefix", None))

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, truncated to ``max_length`` (special tokens included)."""
        return [e.ids for e in _encode_batch(self._cut, [t[: self.max_chars] for t in texts])]

    def _tokenized(self, item: InferenceItem, enc: Any, truncated: bool) -> TokenizedItem:
        type_ids = list(enc.type_ids) if item.text_pair is not None else None
        alignment = self.align(item.text, enc) if self.alignment else None
        return TokenizedItem(item, enc.ids, len(enc.ids), truncated, type_ids, alignment)

    def align(self, text: str, enc: Any) -> TokenAlignment:
        """Spans, special flags and the pipeline's ``is_subword`` rule of one encoding
        (transformers ``TokenClassificationPipeline.gather_pre_entities``)."""
        offsets = [(int(a), int(b)) for a, b in enc.offsets]
        special = [bool(m) for m in enc.special_tokens_mask]
        subword: list[bool] = []
        for token, token_id, (start, end) in zip(enc.tokens, enc.ids, offsets, strict=True):
            if self._subword_prefix:
                is_sub = len(token) != end - start
            else:
                is_sub = start > 0 and " " not in text[start - 1 : start + 1]
            subword.append(is_sub and token_id != self._unk_id)
        return TokenAlignment(offsets, special, subword)

    def tokenize(self, items: Sequence[InferenceItem]) -> list[TokenizedItem | Rejected]:
        """Tokenize one chunk of items; one result per item, in order.

        Returns a :class:`TokenizedItem` (``truncated`` when cut to ``max_length``) or, for an
        over-length item that may not be truncated, a :class:`Rejected` with
        ``input_too_long``. Empty input yields only special tokens (still an item). A window
        of a long text (``item.window``, contract 1.3) is not tokenized again: its ids as split.
        """
        if not items:
            return []
        if any(_split(it) for it in items):  # windows come tokenized (contract 1.3)
            rest = iter(self.tokenize([it for it in items if not _split(it)]))
            return [_windowed(it) if _split(it) else next(rest) for it in items]
        texts = [_input(it, self.max_chars) for it in items]
        cut_chars = [_longer_than(it, self.max_chars) for it in items]
        encodings = _encode_batch(self._full, texts, self.alignment)
        results: list[TokenizedItem | Rejected | None] = [None] * len(items)
        to_cut: list[int] = []
        for i, (it, enc) in enumerate(zip(items, encodings, strict=True)):
            n = len(enc.ids)
            if n <= self.max_length and not cut_chars[i]:
                results[i] = self._tokenized(it, enc, truncated=False)
                continue
            allowed = self.truncate_by_default if it.truncate is None else it.truncate
            if allowed:
                to_cut.append(i)
            else:
                if not cut_chars[i]:
                    why = f"{n} tokens"
                elif n <= self.max_length:
                    why = f"more than {self.max_chars} characters"
                else:  # n counts only the first max_chars characters
                    why = f"more than {self.max_chars} characters (at least {n} tokens)"
                results[i] = _too_long(it, max(n, self.max_length + 1), why, self.max_length)
        if to_cut:
            cut = _encode_batch(self._cut, [texts[i] for i in to_cut], self.alignment)
            for i, enc in zip(to_cut, cut, strict=True):
                results[i] = self._tokenized(items[i], enc, truncated=True)
        return [r for r in results if r is not None]


class WordCountTokenizer:
    """The ``noop`` model's stand-in tokenizer: one token per space-separated word plus two
    special tokens, ids all 0 — no vocabulary, no Rust call.

    ``kbatch bench e2e``'s ``passthrough`` variant replaces the whole model (tokenizer and
    network) by no-ops, so what it measures is kbatch itself: decode, dedup, buckets, replies,
    commits. Lengths still spread over the buckets like real text. Same over-length policy
    as :class:`HFTokenizer` (cut to ``max_length`` or ``input_too_long``).

    Args:
        max_length: maximum tokens per item, special tokens included (≥ 2).
        truncate_by_default: the server's policy for items whose ``truncate`` is None.
    """

    def __init__(self, max_length: int, *, truncate_by_default: bool = True) -> None:
        if max_length < 2:
            raise ValueError(f"max_length must be >= 2, got {max_length}")
        self.max_length = max_length
        self.truncate_by_default = truncate_by_default

    def tokenize(self, items: Sequence[InferenceItem]) -> list[TokenizedItem | Rejected]:
        """One result per item, in order (see :class:`HFTokenizer.tokenize`)."""
        out: list[TokenizedItem | Rejected] = []
        cap = self.max_length
        for it in items:
            n = it.text[: 16 * cap].count(" ") + 3  # words + [CLS] and [SEP]
            if n <= cap:
                out.append(TokenizedItem(it, [0] * n, n, truncated=False))
            elif self.truncate_by_default if it.truncate is None else it.truncate:
                out.append(TokenizedItem(it, [0] * cap, cap, truncated=True))
            else:
                out.append(_too_long(it, n, f"{n} tokens", cap))
        return out
