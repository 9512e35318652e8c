"""Contract 1.3's token-classify windows through kbatch's own path (splitter → fan-out →
engine buckets → padded batches → runner → reply shaping), on tiny models built here:

- entities = ``transformers.pipeline("token-classification", aggregation_strategy=A,
  stride=S)`` for every strategy the pipeline allows with a stride (same labels and spans,
  scores within 1e-5), on texts of 1 to 10 windows with Unicode, windows that end in the
  middle of a word and entities across a window edge;
- embed chunks: each chunk's vector = sentence-transformers' ``encode`` of its text (with the
  prompt), the pooled vector their token-weighted mean (re-normalised when the model
  normalises), texts of 1 to 10 chunks;
- rerank MaxP: a document's score = ``CrossEncoder.predict`` of its best window's pair;
- redaction coverage: a model that tags every token, texts of 1 to 20 windows: nothing of the
  input but whitespace is left outside a ``[LABEL]``, for every strategy, both tag kinds
  (``B-``: an entity per token or word; ``I-``: one entity per window, which the overlap merge
  partly drops) and with or without overlap.
"""

from __future__ import annotations

import asyncio
import random
import re
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from consumer.batching.config import BatchPolicyConfig
from consumer.batching.engine import Engine
from consumer.batching.fanout import CHUNKS
from consumer.batching.types import ChunkPlan, InferenceItem, ItemOutcome
from consumer.model.loader import load_runner
from consumer.model.tokenize import HFTokenizer
from consumer.model.windows import TokenWindows, fan_out_for
from consumer.options import EmbedOptions, ModelProfile
from consumer.replies.chunking import shape_chunks
from consumer.replies.task_options import TaskOptions, shape_task_result
from schemas.models import Aggregation
from tests.fixtures.task_models import build_tag_everything_classifier, build_tiny_token_classifier

MAX_LENGTH = 32  # a window: [CLS] + 30 tokens + [SEP]
STRIDE = 6
WORDS = (
    *("Sarah", "Connor", "met", "John", "in", "Los", "Angeles", "near", "Zürich", "and"),
    *("東京", ";", "the", "naïve", "café", "served", "photosynthesis", "unbelievably"),
    *("uncommon", "tokenization", "—", "Ωmega", "straße", "résumé", "🙂", "Kafka"),
)
POLICY = BatchPolicyConfig(
    max_wait_ms=5.0, max_batch_tokens=512, bucket_edges=(16, 32), adaptive_wait=False
)


def texts_of_windows(tokenizer: HFTokenizer, stride: int, counts: Sequence[int]) -> list[str]:
    """One text per count, of exactly that many windows: random words of :data:`WORDS`,
    added until the splitter makes that many windows, then a random few more that keep it."""
    splitter = TokenWindows(tokenizer, stride=stride, max_windows=64)

    def windows(words: list[str]) -> int:
        (split,) = splitter.split([InferenceItem(0, " ".join(words))])
        assert isinstance(split, list)
        return len(split)

    out: list[str] = []
    for want in counts:
        rng = random.Random(want)
        words = [rng.choice(WORDS)]
        while windows(words) < want:
            words.append(rng.choice(WORDS))
        for _ in range(rng.randint(0, 12)):
            more = [*words, rng.choice(WORDS)]
            if windows(more) > want:
                break
            words = more
        out.append(" ".join(words))
    return out


async def run_windows(model_dir: Path, texts: Sequence[str], stride: int) -> dict[int, ItemOutcome]:
    """Every text as a windowed token-classify item through the fan-out and the engine."""
    runner = load_runner(model_dir, task="token-classify", device="cpu", max_length=MAX_LENGTH)
    tokenizer = HFTokenizer(model_dir, max_length=MAX_LENGTH, alignment=True)
    outcomes: dict[int, ItemOutcome] = {}

    def collect(done: Sequence[ItemOutcome]) -> None:
        outcomes.update((o.item_id, o) for o in done)

    engine = Engine(runner, tokenizer, POLICY, warmup="largest")
    fanout = fan_out_for(
        "token-classify", tokenizer, engine, collect, stride=stride, max_windows=64
    )
    assert fanout is not None
    await engine.start()
    await fanout.submit(
        [InferenceItem(i, t, arrival_s=0.0, windows=True) for i, t in enumerate(texts)]
    )
    assert await engine.drain(timeout_s=120)
    await engine.stop()
    assert sorted(outcomes) == list(range(len(texts)))
    assert all(o.status == "ok" for o in outcomes.values())
    return outcomes


@pytest.fixture(scope="module")
def ner_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_token_classifier(tmp_path_factory.mktemp("tiny-ner-windows"))


@pytest.fixture(scope="module")
def parity_texts(ner_dir: Path) -> list[str]:
    tokenizer = HFTokenizer(ner_dir, max_length=MAX_LENGTH, alignment=True)
    return texts_of_windows(tokenizer, STRIDE, range(1, 11))


@pytest.fixture(scope="module")
def parity_outcomes(ner_dir: Path, parity_texts: list[str]) -> dict[int, ItemOutcome]:
    return asyncio.run(run_windows(ner_dir, parity_texts, STRIDE))


@pytest.mark.parametrize("aggregation", ["simple", "first", "max", "average"])
def test_window_entities_equal_the_pipeline_with_stride(
    ner_dir: Path,
    parity_texts: list[str],
    parity_outcomes: dict[int, ItemOutcome],
    aggregation: Aggregation,
) -> None:
    from transformers import pipeline

    reference = pipeline(
        "token-classification", model=str(ner_dir), aggregation_strategy=aggregation,
        stride=STRIDE, device="cpu",
    )  # fmt: skip
    reference.tokenizer.model_max_length = MAX_LENGTH
    splitter = TokenWindows(
        HFTokenizer(ner_dir, max_length=MAX_LENGTH, alignment=True), stride=STRIDE
    )
    edge_entities = mid_word_edges = found = 0
    for i, text in enumerate(parity_texts):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = reference(text)
        outcome = parity_outcomes[i]
        shaped = shape_task_result(outcome.result or {}, TaskOptions(aggregation=aggregation))
        got = shaped["entities"]
        assert [(e["label"], e["start"], e["end"]) for e in got] == [
            (e["entity_group"], e["start"], e["end"]) for e in expected
        ], text
        assert np.allclose([e["score"] for e in got], [float(e["score"]) for e in expected],
                           atol=1e-5)  # fmt: skip
        assert all(e["text"] == text[e["start"] : e["end"]] for e in got)
        assert not outcome.truncated
        found += len(got)
        # What the texts exercise: windows ending inside a word, entities across an edge.
        (windows,) = splitter.split([InferenceItem(0, text, windows=True)])
        assert isinstance(windows, list) and len(windows) == i + 1
        for w in windows[:-1]:
            assert w.window is not None and w.window.alignment is not None
            edge = max(end for _, end in w.window.alignment.offsets)
            mid_word_edges += edge < len(text) and not text[edge].isspace()
            edge_entities += any(e["start"] < edge < e["end"] for e in got)
    assert mid_word_edges > 0 and edge_entities > 0 and found > 20


# ---- redaction coverage -----------------------------------------------------------------------


@pytest.fixture(scope="module", params=["B-PER", "I-PER"])
def tag_all_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tag_everything_classifier(
        tmp_path_factory.mktemp(f"tag-all-{request.param}"), label=request.param
    )


@pytest.mark.parametrize("stride", [0, STRIDE])
def test_redaction_leaves_no_character_of_the_input_unscanned(
    tag_all_dir: Path, stride: int
) -> None:
    tokenizer = HFTokenizer(tag_all_dir, max_length=MAX_LENGTH, alignment=True)
    texts = texts_of_windows(tokenizer, stride, range(1, 21))
    outcomes = asyncio.run(run_windows(tag_all_dir, texts, stride))
    for aggregation in ("simple", "first", "max", "average", "none"):
        for i, text in enumerate(texts):
            shaped = shape_task_result(
                outcomes[i].result or {}, TaskOptions(aggregation=aggregation, redact=True)
            )
            left = re.sub(r"\[(B-|I-)?PER\]", "", shaped["redacted"])
            assert left.isspace() or left == "", (aggregation, i + 1, left[:80])
            assert shaped["entities"] and not text.isspace()


# ---- rerank: MaxP -----------------------------------------------------------------------------


async def run_rerank(model_dir: Path, query: str, docs: Sequence[str]) -> ItemOutcome:
    runner = load_runner(model_dir, task="rerank", device="cpu", max_length=MAX_LENGTH)
    tokenizer = HFTokenizer(model_dir, max_length=MAX_LENGTH)
    outcomes: list[ItemOutcome] = []
    engine = Engine(runner, tokenizer, POLICY, warmup="largest")
    fanout = fan_out_for(
        "rerank", tokenizer, engine, outcomes.extend, stride=STRIDE, max_windows=64
    )
    assert fanout is not None
    await engine.start()
    await fanout.submit([InferenceItem(0, query, documents=tuple(docs), windows=True)])
    assert await engine.drain(timeout_s=120)
    await engine.stop()
    (outcome,) = outcomes
    assert outcome.status == "ok", outcome.error_message
    return outcome


def test_a_long_document_scores_its_best_window_as_cross_encoder_predict(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from sentence_transformers import CrossEncoder

    from consumer.model.windows import PairWindows
    from tests.fixtures.task_models import build_tiny_cross_encoder

    model_dir = build_tiny_cross_encoder(tmp_path_factory.mktemp("tiny-ce-windows"))
    tokenizer = HFTokenizer(model_dir, max_length=MAX_LENGTH, alignment=True)
    query = "where did Sarah meet John?"
    docs = [text[: len(text) - k % 3] for k, text in enumerate(texts_of_windows(
        tokenizer, STRIDE, range(1, 11)))]  # fmt: skip
    outcome = asyncio.run(run_rerank(model_dir, query, docs))
    assert outcome.result is not None and not outcome.truncated
    shaped = shape_task_result(outcome.result, TaskOptions(top_n=len(docs)))
    reference = CrossEncoder(str(model_dir), device="cpu", max_length=MAX_LENGTH)
    (pairs,) = PairWindows(tokenizer, stride=STRIDE).split(
        [InferenceItem(0, query, documents=tuple(docs), windows=True)]
    )
    assert isinstance(pairs, list)
    windowed = 0
    for d, doc in enumerate(docs):
        spans = [p.window for p in pairs if p.window is not None and p.window.document == d]
        windowed += len(spans) > 1
        scores = reference.predict([(query, doc[w.start : w.end]) for w in spans])
        best = int(np.argmax(scores))
        assert abs(shaped["scores"][d] - float(scores[best])) < 1e-5
        (entry,) = [e for e in shaped["top"] if e["index"] == d]
        if len(spans) > 1:
            window = spans[best]
            assert entry["window"] == {
                "index": best,
                "count": len(spans),
                "start": window.start,
                "end": window.end,
            }
        else:
            assert "window" not in entry and spans[0].end == len(doc)
        # every word of the document is in some window (nothing past the first is lost)
        covered = set().union(*(range(w.start, w.end) for w in spans))
        assert all(i in covered for i, c in enumerate(doc) if not c.isspace())
    assert windowed >= 8


# ---- embed: chunks ----------------------------------------------------------------------------


async def run_chunks(
    model_dir: Path, texts: Sequence[str], plan: ChunkPlan
) -> dict[int, ItemOutcome]:
    runner = load_runner(model_dir, task="embed", device="cpu")
    tokenizer = HFTokenizer(model_dir)
    outcomes: dict[int, ItemOutcome] = {}

    def collect(done: Sequence[ItemOutcome]) -> None:
        outcomes.update((o.item_id, o) for o in done)

    engine = Engine(runner, tokenizer, POLICY, warmup="largest")
    fanout = fan_out_for("embed", tokenizer, engine, collect, max_windows=64)
    assert fanout is not None
    await engine.start()
    items = [InferenceItem(i, t, windows=True, chunking=plan) for i, t in enumerate(texts)]
    await fanout.submit([*items, InferenceItem(len(texts), texts[0])])  # one plain request
    assert await engine.drain(timeout_s=120)
    await engine.stop()
    assert all(o.status == "ok" for o in outcomes.values())
    return outcomes


@pytest.mark.parametrize("normalize", [True, False])
def test_each_chunk_equals_encode_of_its_text_and_the_pool_is_their_token_weighted_mean(
    tmp_path_factory: pytest.TempPathFactory, normalize: bool
) -> None:
    from sentence_transformers import SentenceTransformer

    from tests.fixtures.tiny_models import PROMPTS, build_tiny_embedder

    model_dir = build_tiny_embedder(
        tmp_path_factory.mktemp(f"tiny-embed-{normalize}"), normalize=normalize, prompts=PROMPTS
    )
    tokenizer = HFTokenizer(model_dir, max_length=MAX_LENGTH)
    texts = texts_of_windows(tokenizer, 0, range(1, 11))
    plan = ChunkPlan(max_tokens=MAX_LENGTH, overlap=4, prompt=PROMPTS["query"])
    outcomes = asyncio.run(run_chunks(model_dir, texts, plan))
    reference = SentenceTransformer(str(model_dir), device="cpu")
    profile = ModelProfile(task="embed", dim=32, normalizes=normalize, prompts=PROMPTS)
    several = 0
    for i, text in enumerate(texts):
        raw = outcomes[i].result or {}
        chunks = shape_chunks(raw, EmbedOptions(), "chunks", profile)["chunks"]
        several += len(chunks) > 1
        pieces = [text[c["start"] : c["end"]] for c in chunks]
        expected = reference.encode(pieces, prompt_name="query")
        assert np.allclose([c["embedding"] for c in chunks], expected, atol=1e-5)
        assert all(p.strip() for p in pieces) and chunks[-1]["end"] == len(text.rstrip())
        covered = set().union(*(range(c["start"], c["end"]) for c in chunks))
        assert all(k in covered for k, ch in enumerate(text) if not ch.isspace())
        # pooled: the chunks' vectors weighted by their tokens, re-normalised if normalising
        weights = [len(tokenizer.encode([PROMPTS["query"] + p])[0]) for p in pieces]
        assert weights == [n for _, n, _, _ in raw[CHUNKS]]
        assert max(weights) <= MAX_LENGTH
        mean = np.average(expected, axis=0, weights=weights)
        if normalize:
            mean = mean / np.linalg.norm(mean)
        pooled = shape_chunks(raw, EmbedOptions(), "pooled", profile)
        assert np.allclose(pooled["embedding"], mean, atol=1e-5)
        f16 = shape_chunks(raw, EmbedOptions(encoding_format="f16le", dimensions=8), "chunks",
                           profile)  # fmt: skip
        assert f16["dim"] == 8 and all(len(c["embedding"]) == 16 for c in f16["chunks"])
    assert several >= 8
    plain = outcomes[len(texts)].result or {}
    assert CHUNKS not in plain and np.allclose(plain["embedding"], reference.encode(texts[0]),
                                               atol=1e-5)  # fmt: skip
