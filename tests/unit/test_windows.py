"""Contract 1.3's windows, piece by piece: the splitter against transformers' overflow, the
fan-out's gathering and refusals, the window rule per request, and the cross-window merge and
redaction (fakes; no model)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from consumer.batching.fanout import FanOutEngine
from consumer.batching.types import InferenceItem, ItemOutcome, Rejected, Window
from consumer.entities import TOKENS, TokenScores, merge_overlapping, redact, redact_windows
from consumer.model.tokenize import HFTokenizer
from consumer.model.windows import TokenWindows
from consumer.replies.task_options import FIRST_WINDOW, window_rule
from schemas.errors import ErrorCode
from tests.fakes import FakeEngine
from tests.fixtures.tiny_models import minilm_dir

LONG = "Unbelievably, Zürich's naïve café served photosynthesis to 東京 visitors at dawn. " * 4


class Collect:
    def __init__(self) -> None:
        self.calls: list[list[ItemOutcome]] = []

    def __call__(self, outcomes: Sequence[ItemOutcome]) -> None:
        self.calls.append(list(outcomes))


class FakeWindower:
    """``n`` windows per item (``window.input_ids`` = [index]); over ``cap``: refused."""

    def __init__(self, n: int, cap: int = 8) -> None:
        self.n, self.cap = n, cap

    def split(self, items: Sequence[InferenceItem]) -> list[list[InferenceItem] | Rejected]:
        out: list[list[InferenceItem] | Rejected] = []
        for it in items:
            if self.n > self.cap:
                out.append(Rejected(it, 999, ErrorCode.INPUT_TOO_LONG, "too many windows"))
                continue
            out.append(
                [
                    InferenceItem(
                        it.item_id, it.text, group=it.group, window=Window(k, self.n, [k])
                    )
                    for k in range(self.n)
                ]
            )
        return out


def ok(item_id: int, value: object, n_tokens: int = 4, infer_ms: float = 1.0) -> ItemOutcome:
    return ItemOutcome(item_id, "ok", {TOKENS: value}, None, None, False, n_tokens, 0.5,
                       infer_ms, 2, 8)  # fmt: skip


async def test_a_windowed_item_runs_as_one_sequence_per_window_and_answers_once() -> None:
    collect = Collect()
    engine = FakeEngine()
    fanout = FanOutEngine(engine, collect, windower=FakeWindower(3))
    item = InferenceItem(5, "long text", windows=True, group="tp")
    await fanout.submit([item, InferenceItem(6, "short", group="tp")])
    windows = engine.items[:3]
    assert [w.window.index for w in windows if w.window] == [0, 1, 2]
    assert len({w.item_id for w in engine.items}) == 4 and engine.items[3].window is None
    fanout.on_outcomes([ok(windows[2].item_id, "c", infer_ms=7.0), ok(windows[0].item_id, "a")])
    assert collect.calls == []  # not before every window is done
    fanout.on_outcomes([ok(windows[1].item_id, "b"), ok(engine.items[3].item_id, "s")])
    by_id = {o.item_id: o for o in collect.calls[0]}
    assert by_id[5].result == {TOKENS: ("a", "b", "c")}  # window order
    assert (by_id[5].n_tokens, by_id[5].infer_ms) == (12, 7.0)  # tokens summed, slowest window
    assert by_id[6].result == {TOKENS: "s"}


async def test_a_text_over_the_window_cap_is_input_too_long_and_never_computed() -> None:
    collect = Collect()
    engine = FakeEngine()
    fanout = FanOutEngine(engine, collect, windower=FakeWindower(9, cap=8))
    assert await fanout.submit([InferenceItem(1, "huge", windows=True)]) == [999]
    assert engine.items == [] and collect.calls == []  # answered after submit returns
    await asyncio.sleep(0)  # the call_soon'd answer (no timing involved: one loop turn)
    ((done,),) = collect.calls
    assert (done.item_id, done.status, done.error_code) == (1, "error", "input_too_long")


async def test_items_submitted_with_their_own_callback_are_answered_there() -> None:
    owner, job = Collect(), Collect()
    engine = FakeEngine()
    fanout = FanOutEngine(engine, owner, windower=FakeWindower(2))
    await fanout.submit([InferenceItem(-3, "job text", windows=True)], on_outcomes=job)
    fanout.on_outcomes([ok(w.item_id, w.window.index if w.window else -1) for w in engine.items])
    assert owner.calls == [] and [o.result for o in job.calls[0]] == [{TOKENS: (0, 1)}]


@pytest.mark.parametrize(
    ("truncate", "redact", "expected"),
    [
        (None, None, (True, None)),
        (False, None, (True, None)),  # windows cut nothing
        (True, True, (True, None)),  # a redaction is never truncated
        (True, None, (False, FIRST_WINDOW)),  # 1.2's first window, under its own dedup key
        (True, False, (False, FIRST_WINDOW)),
    ],
)
def test_the_window_rule_of_token_classify(
    truncate: bool | None, redact: bool | None, expected: tuple[bool, str | None]
) -> None:
    assert window_rule("token-classify", truncate, redact) == expected
    assert window_rule("embed", truncate, redact) == (False, None)
    assert window_rule("sparse", truncate, redact) == (False, None)
    if redact is None:  # rerank: windows (MaxP) unless truncate: true
        assert window_rule("rerank", truncate, None) == expected


@pytest.fixture(scope="module")
def hf_tokenizer() -> HFTokenizer:
    return HFTokenizer(minilm_dir(), max_length=24, alignment=True)


@pytest.mark.parametrize("stride", [0, 5, 21])
def test_windows_are_transformers_overflow_windows(hf_tokenizer: HFTokenizer, stride: int) -> None:
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(minilm_dir()))
    reference.model_max_length = 24
    splitter = TokenWindows(hf_tokenizer, stride=stride, max_windows=200)
    for text in (LONG, "short", LONG[:97]):
        (windows,) = splitter.split([InferenceItem(0, text, windows=True)])
        assert isinstance(windows, list)
        expected = reference(
            text, truncation=True, return_overflowing_tokens=True, stride=stride,
            return_offsets_mapping=True,
        )  # fmt: skip
        assert [w.window.input_ids for w in windows if w.window] == expected["input_ids"]
        for w, offsets in zip(windows, expected["offset_mapping"], strict=True):
            assert w.window is not None and w.window.alignment is not None
            assert w.window.alignment.offsets == [tuple(o) for o in offsets]
            assert (w.window.count, w.windows, w.text) == (len(windows), False, text)


def test_the_window_cap_and_the_stride_range(hf_tokenizer: HFTokenizer) -> None:
    splitter = TokenWindows(hf_tokenizer, stride=2, max_windows=3)
    (refused,) = splitter.split([InferenceItem(0, LONG)])
    assert isinstance(refused, Rejected) and refused.error_code == ErrorCode.INPUT_TOO_LONG
    assert "at most 3 windows" in refused.error_message
    (huge,) = splitter.split([InferenceItem(0, "a" * (splitter.max_chars + 1))])
    assert isinstance(huge, Rejected) and "characters" in huge.error_message
    with pytest.raises(ValueError, match="stride"):
        TokenWindows(hf_tokenizer, stride=22)  # a window holds 22 tokens besides [CLS] [SEP]
    assert TokenWindows(hf_tokenizer).stride == 22 // 8


def test_the_overlap_merge_is_the_pipelines() -> None:
    from transformers import TokenClassificationPipeline

    rng = random.Random(7)
    for _ in range(300):
        entities: list[dict[str, Any]] = []
        for _ in range(rng.randint(0, 8)):
            start = rng.randint(0, 30)
            entities.append({"start": start, "end": start + rng.randint(1, 6),
                             "score": rng.choice([0.5, 0.7, 0.9]), "label": "X"})  # fmt: skip
        expected = TokenClassificationPipeline.aggregate_overlapping_entities(
            None,  # type: ignore[arg-type]  # the method does not use self
            [dict(e) for e in entities],
        )
        assert merge_overlapping(entities) == expected


def scores_of(text: str, spans: list[tuple[int, int]], label: int) -> TokenScores:
    """One window whose tokens (``spans``) all have ``label`` with probability 0.9."""
    probs = np.full((len(spans), 3), 0.05, dtype=np.float32)
    probs[:, label] = 0.9
    return TokenScores(text, probs, ["O", "B-PER", "I-PER"], spans, [False] * len(spans),
                       [False] * len(spans))  # fmt: skip


def test_redaction_covers_what_the_merge_drops() -> None:
    # Two windows tag everything I-PER: each is one entity; they overlap, and the merge keeps
    # only the longer one — redacting the merged list alone would leave "aa bb" in clear.
    text = "aa bb cc dd ee ff"
    first = scores_of(text, [(0, 2), (3, 5), (6, 8)], 2)
    second = scores_of(text, [(6, 8), (9, 11), (12, 14), (15, 17)], 2)
    from consumer.entities import aggregate_windows

    merged = aggregate_windows((first, second))
    assert [(e["start"], e["end"]) for e in merged] == [(6, 17)]
    assert redact(text, merged) == "aa bb [PER]"  # what the merged entities alone give
    assert redact_windows((first, second)) == "[PER]"
    assert redact_windows((first,)) == redact(text, aggregate_windows((first,)))


def test_chunking_the_model_cannot_honour_is_invalid_option(hf_tokenizer: HFTokenizer) -> None:
    from consumer.batching.types import ChunkPlan
    from consumer.model.windows import ChunkWindows

    splitter = ChunkWindows(hf_tokenizer, max_windows=2)
    plans = {
        "over the model's 24": ChunkPlan(25, 0),
        "no token for text": ChunkPlan(6, 0, "represent this sentence: "),
        "overlap 10 must be below": ChunkPlan(12, 10),
    }
    for why, plan in plans.items():
        (refused,) = splitter.split([InferenceItem(0, LONG, windows=True, chunking=plan)])
        assert isinstance(refused, Rejected) and refused.error_code == ErrorCode.INVALID_OPTION
        assert why in refused.error_message
    (too_many,) = splitter.split([InferenceItem(0, LONG, chunking=ChunkPlan(24, 0))])
    assert isinstance(too_many, Rejected) and too_many.error_code == ErrorCode.INPUT_TOO_LONG
    (one,) = splitter.split([InferenceItem(0, "short text", chunking=ChunkPlan(None, 0, "q: "))])
    assert isinstance(one, list) and [
        (i.text, i.window.start, i.window.end) for i in one if i.window
    ] == [("q: short text", 0, 10)]


async def test_cancelling_a_group_forgets_windowed_and_plain_items_alike() -> None:
    collect = Collect()
    engine = FakeEngine()
    fanout = FanOutEngine(engine, collect, windower=FakeWindower(3))
    await fanout.submit(
        [InferenceItem(1, "long", windows=True, group="gone"), InferenceItem(2, "x", group="gone"),
         InferenceItem(3, "long", windows=True, group="kept")]
    )  # fmt: skip
    assert sorted(fanout.cancel_group("gone")) == [1, 2]
    fanout.on_outcomes([ok(w.item_id, "v") for w in engine.items if w.group == "kept"])
    fanout.on_outcomes(
        [ok(w.item_id, "late") for w in engine.items if w.window and w.group == "gone"]
    )
    assert [[o.item_id for o in call] for call in collect.calls] == [[3]]


async def test_an_expired_or_failed_window_is_the_requests_answer() -> None:
    collect = Collect()
    engine = FakeEngine()
    fanout = FanOutEngine(engine, collect, windower=FakeWindower(3))
    await fanout.submit([InferenceItem(4, "long", windows=True)])
    first, second, third = engine.items
    expired = ItemOutcome(second.item_id, "expired", None, "deadline_exceeded", "late", False,
                          4, 9.0, 0.0, 0, 0)  # fmt: skip
    fanout.on_outcomes([ok(first.item_id, "a"), expired, ok(third.item_id, "c")])
    ((done,),) = collect.calls
    assert (done.item_id, done.status, done.error_code, done.result) == (
        4, "expired", "deadline_exceeded", None
    )  # fmt: skip
    assert done.n_tokens == 12  # usage: every window's tokens


async def test_chunking_without_a_tokenizer_is_invalid_option() -> None:
    from consumer.batching.types import ChunkPlan
    from consumer.model.tokenize import WordCountTokenizer
    from consumer.model.windows import fan_out_for

    collect = Collect()
    engine = FakeEngine()
    fanout = fan_out_for("embed", WordCountTokenizer(16), engine, collect)  # the noop model's
    assert fanout is not None
    chunked = InferenceItem(1, "text", windows=True, chunking=ChunkPlan(8, 0))
    await fanout.submit([chunked, InferenceItem(2, "plain")])
    assert [it.item_id for it in engine.items] == [2]  # only the plain one computed
    await asyncio.sleep(0)  # the refusal is answered on the next loop turn
    ((refused,),) = collect.calls
    assert (refused.item_id, refused.error_code) == (1, "invalid_option")
