"""The fast tokenizer stage: special tokens, truncation, rejection, the character pre-limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumer.batching.types import InferenceItem, Rejected, TokenizedItem
from consumer.model.tokenize import HFTokenizer
from schemas.errors import ErrorCode


@pytest.fixture(scope="module")
def tok(tiny_embed_dir: Path) -> HFTokenizer:
    return HFTokenizer(tiny_embed_dir)  # max length 64


def one(tok: HFTokenizer, text: str, truncate: bool | None = None) -> TokenizedItem | Rejected:
    return tok.tokenize([InferenceItem(0, text, truncate=truncate)])[0]


@pytest.mark.parametrize(
    ("text", "n_tokens"),
    [("", 2), ("   ", 2), ("hello", 3), ("hello world", 4), ("Hello, World!", 6)],
)
def test_lengths_include_special_tokens(tok: HFTokenizer, text: str, n_tokens: int) -> None:
    r = one(tok, text)
    assert isinstance(r, TokenizedItem)
    assert r.n_tokens == n_tokens == len(r.input_ids)
    assert r.input_ids[0] == 101 and r.input_ids[-1] == 102 and not r.truncated


@pytest.mark.parametrize("truncate", [True, None])
def test_over_length_is_truncated_by_default(tok: HFTokenizer, truncate: bool | None) -> None:
    r = one(tok, "word " * 100, truncate)
    assert isinstance(r, TokenizedItem)
    assert r.truncated and r.n_tokens == 64 and r.input_ids[-1] == 102


def test_over_length_is_rejected_when_truncate_is_false(tok: HFTokenizer) -> None:
    r = one(tok, "word " * 100, truncate=False)
    assert isinstance(r, Rejected)
    assert r.error_code == ErrorCode.INPUT_TOO_LONG and r.n_tokens == 102
    assert "word" not in r.error_message  # never echoes the input


def test_exactly_max_length_is_not_truncated(tok: HFTokenizer) -> None:
    r = one(tok, "word " * 62, truncate=False)
    assert isinstance(r, TokenizedItem) and r.n_tokens == 64 and not r.truncated


def test_a_huge_text_is_cut_by_characters_first(tok: HFTokenizer) -> None:
    assert tok.max_chars == 16 * 64
    r = one(tok, "x" * (1 << 20))
    assert isinstance(r, TokenizedItem) and r.truncated and r.n_tokens <= 64
    rejected = one(tok, "x" * (1 << 20), truncate=False)
    assert isinstance(rejected, Rejected)


def test_a_long_text_cut_by_characters_reports_a_lower_bound(tok: HFTokenizer) -> None:
    # Regression: 2,000 words reported "input has 780 tokens", the count of
    # the first max_chars characters only.
    rejected = one(tok, "word " * 2000, truncate=False)
    assert isinstance(rejected, Rejected)
    assert f"more than {tok.max_chars} characters (at least" in rejected.error_message


def test_a_chunk_keeps_order_and_mixes_outcomes(tok: HFTokenizer) -> None:
    items = [
        InferenceItem(1, "short"),
        InferenceItem(2, "long " * 80, truncate=False),
        InferenceItem(3, "long " * 80),
        InferenceItem(4, "two words"),
    ]
    out = tok.tokenize(items)
    assert [r.item.item_id for r in out] == [1, 2, 3, 4]
    assert [type(r).__name__ for r in out] == [
        "TokenizedItem",
        "Rejected",
        "TokenizedItem",
        "TokenizedItem",
    ]
    assert tok.tokenize([]) == []


def test_server_policy_can_reject_by_default(tiny_embed_dir: Path) -> None:
    strict = HFTokenizer(tiny_embed_dir, truncate_by_default=False)
    assert isinstance(one(strict, "word " * 100), Rejected)
    assert isinstance(one(strict, "word " * 100, truncate=True), TokenizedItem)


def test_ids_match_the_tokenizers_full_encode_batch(tok: HFTokenizer) -> None:
    # The stage encodes without character offsets where it can; the ids must not change.
    texts = ["Hello, World!", "", "héllo wörld 你好 🙂", "word " * 100]
    got = tok.tokenize([InferenceItem(i, t) for i, t in enumerate(texts)])
    expected = [e.ids for e in tok._cut.encode_batch(texts)]
    assert [r.input_ids for r in got if isinstance(r, TokenizedItem)] == expected
    assert tok.encode(texts) == expected
