"""Contract 1.2's tasks against their reference libraries, through kbatch's own path
(tokenizer → engine buckets → padded batches → runner → reply shaping), on tiny random models
built here (``tests/fixtures/task_models.py``):

- rerank = sentence-transformers ``CrossEncoder.predict`` (within 1e-5, same order);
- sparse = ``SparseEncoder.encode`` (same indices, values within 1e-5; ``top_k`` =
  ``max_active_dims``);
- token-classify = ``transformers.pipeline("token-classification", aggregation_strategy=…)``
  (same labels, spans, scores within 1e-5), and redaction built from those entities.

Each runs with two batching set-ups (one item per batch; mixed lengths in shared batches):
the results must not differ.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from consumer.batching.config import BatchPolicyConfig
from consumer.batching.engine import Engine
from consumer.batching.fanout import FanOutEngine
from consumer.batching.types import InferenceItem, ItemOutcome
from consumer.entities import redact
from consumer.model.batch_runner import ModelRunner
from consumer.model.loader import load_runner
from consumer.model.tokenize import HFTokenizer
from consumer.replies.task_options import TaskOptions, shape_task_result
from schemas.models import Aggregation
from schemas.sparse import decode_sparse
from tests.fixtures.task_models import (
    build_tiny_cross_encoder,
    build_tiny_splade,
    build_tiny_token_classifier,
)

TEXTS = [
    "My name is Wolfgang and I live in Berlin, near Unterföhring.",
    "Kafka",
    "Sarah Connor met John in Los Angeles on a rainy Tuesday afternoon in 1984.",
    "tokenization of unbelievably uncommon words: photosynthesis, Zürich, naïve café",
    "a b c",
    "The quick brown fox jumps over the lazy dog " * 3,
]
QUERY = "where do consumers commit offsets?"
DOCUMENTS = [
    "Consumers commit offsets to the __consumer_offsets topic.",
    "Bananas are yellow.",
    "A long document about Kafka, brokers, partitions, replication and consumer groups " * 2,
    "offsets",
    "Where do consumers commit offsets? In Kafka.",
]

BATCHINGS = {
    "one-per-batch": BatchPolicyConfig(max_wait_ms=0.0, max_batch_size=1),
    "mixed": BatchPolicyConfig(
        max_wait_ms=5.0, max_batch_tokens=2048, bucket_edges=(128,), adaptive_wait=False
    ),
}


async def run_engine(
    runner: ModelRunner,
    tokenizer: HFTokenizer,
    items: Sequence[InferenceItem],
    policy: BatchPolicyConfig,
    *,
    fan_out: bool = False,
) -> dict[int, ItemOutcome]:
    """Every item through an engine (and the rerank fan-out); outcomes by item id."""
    outcomes: dict[int, ItemOutcome] = {}

    def collect(done: Sequence[ItemOutcome]) -> None:
        outcomes.update((o.item_id, o) for o in done)

    engine = Engine(runner, tokenizer, policy, collect, warmup="largest")
    front: Any = FanOutEngine(engine, collect) if fan_out else engine
    await engine.start()
    await front.submit(list(items))
    assert await engine.drain(timeout_s=120)
    await engine.stop()
    assert set(outcomes) == {it.item_id for it in items}
    return outcomes


def ok_result(outcome: ItemOutcome) -> dict[str, Any]:
    assert outcome.status == "ok", outcome.error_message
    assert outcome.result is not None
    return outcome.result


# ---- rerank -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cross_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_cross_encoder(tmp_path_factory.mktemp("tiny-ce"))


@pytest.mark.parametrize("batching", sorted(BATCHINGS))
async def test_rerank_scores_equal_cross_encoder_predict(
    cross_encoder_dir: Path, batching: str
) -> None:
    from sentence_transformers import CrossEncoder

    runner = load_runner(cross_encoder_dir, task="rerank", device="cpu")
    tokenizer = HFTokenizer(cross_encoder_dir)
    queries = [QUERY, "bananas", TEXTS[2]]
    items = [
        InferenceItem(i, q, documents=tuple(DOCUMENTS), arrival_s=0.0)
        for i, q in enumerate(queries)
    ]
    outcomes = await run_engine(runner, tokenizer, items, BATCHINGS[batching], fan_out=True)
    reference = CrossEncoder(str(cross_encoder_dir), device="cpu")
    for i, query in enumerate(queries):
        expected = reference.predict([(query, d) for d in DOCUMENTS])
        result = ok_result(outcomes[i])
        scores = result["scores"]
        assert len(scores) == len(DOCUMENTS)
        assert np.allclose(scores, expected, atol=1e-5, rtol=0)
        assert (
            np.argsort(scores, kind="stable").tolist()
            == np.argsort(expected, kind="stable").tolist()
        )
        assert len(set(np.round(expected, 5).tolist())) > 1  # the order means something
        # top_n: the best documents, highest first (CrossEncoder.rank).
        shaped = shape_task_result(result, TaskOptions(top_n=3))
        ranked = reference.rank(query, DOCUMENTS, top_k=3)
        assert [d["index"] for d in shaped["top"]] == [r["corpus_id"] for r in ranked]
        assert shaped["scores"] == scores
        assert outcomes[i].n_tokens == sum(
            len(tokenizer.encode([query])[0]) + len(tokenizer.encode([d])[0]) - 1 for d in DOCUMENTS
        )  # each pair: [CLS] query [SEP] document [SEP]


# ---- sparse -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def splade_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_splade(tmp_path_factory.mktemp("tiny-splade") / "model")


@pytest.mark.parametrize("batching", sorted(BATCHINGS))
async def test_sparse_vectors_equal_sparse_encoder_encode(splade_dir: Path, batching: str) -> None:
    from sentence_transformers import SparseEncoder

    runner = load_runner(splade_dir, task="sparse", device="cpu")
    items = [InferenceItem(i, t, arrival_s=0.0) for i, t in enumerate(TEXTS)]
    outcomes = await run_engine(runner, HFTokenizer(splade_dir), items, BATCHINGS[batching])
    reference = SparseEncoder(str(splade_dir), device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = reference.encode(TEXTS, convert_to_tensor=True).to_dense().numpy()
        top = reference.encode(TEXTS, convert_to_tensor=True, max_active_dims=20).to_dense()
    for i in range(len(TEXTS)):
        raw = ok_result(outcomes[i])
        for fmt in ("float", "f32le"):
            shaped = shape_task_result(raw, TaskOptions(encoding_format=fmt))  # type: ignore[arg-type]
            indices, values = decode_sparse(shaped)
            (expected,) = np.nonzero(full[i])
            assert indices.tolist() == expected.tolist() and len(expected) > 10
            assert np.allclose(values, full[i][expected], atol=1e-5, rtol=0)
            assert shaped["dim"] == full.shape[1]
        shaped = shape_task_result(raw, TaskOptions(top_k=20))
        (expected,) = np.nonzero(top[i].numpy())
        assert shaped["indices"] == expected.tolist()
        assert np.allclose(shaped["values"], top[i].numpy()[expected], atol=1e-5, rtol=0)


# ---- token-classify ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ner_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_token_classifier(tmp_path_factory.mktemp("tiny-ner"))


@pytest.fixture(scope="module")
def ner_outcomes(ner_dir: Path) -> dict[str, dict[int, ItemOutcome]]:
    import asyncio

    runner = load_runner(ner_dir, task="token-classify", device="cpu")
    tokenizer = HFTokenizer(ner_dir, alignment=True)
    items = [InferenceItem(i, t, arrival_s=0.0) for i, t in enumerate(TEXTS)]
    return {
        name: asyncio.run(run_engine(runner, tokenizer, items, policy))
        for name, policy in BATCHINGS.items()
    }


@pytest.mark.parametrize("aggregation", ["none", "simple", "first", "max", "average"])
def test_entities_equal_the_token_classification_pipeline(
    ner_dir: Path, ner_outcomes: dict[str, dict[int, ItemOutcome]], aggregation: Aggregation
) -> None:
    from transformers import pipeline

    reference = pipeline(
        "token-classification", model=str(ner_dir), aggregation_strategy=aggregation, device="cpu"
    )
    for i, text in enumerate(TEXTS):
        expected = reference(text)
        label_key = "entity" if aggregation == "none" else "entity_group"
        for batching, outcomes in ner_outcomes.items():
            shaped = shape_task_result(
                ok_result(outcomes[i]), TaskOptions(aggregation=aggregation, redact=True)
            )
            got = shaped["entities"]
            assert [(e["label"], e["start"], e["end"]) for e in got] == [
                (e[label_key], e["start"], e["end"]) for e in expected
            ], (batching, text)
            assert np.allclose(
                [e["score"] for e in got], [float(e["score"]) for e in expected], atol=1e-5
            )
            assert all(e["text"] == text[e["start"] : e["end"]] for e in got)
            assert shaped["redacted"] == redact(text, got)
    assert any(ner_outcomes["mixed"][i].batch_size > 1 for i in range(len(TEXTS)))


def test_redaction_replaces_each_entity_span_by_its_label() -> None:
    text = "Sarah Connor lives in Los Angeles."
    entities = [
        {"label": "PER", "score": 0.9, "start": 0, "end": 12, "text": "Sarah Connor"},
        {"label": "LOC", "score": 0.8, "start": 22, "end": 33, "text": "Los Angeles"},
    ]
    assert redact(text, entities) == "[PER] lives in [LOC]."
    assert redact(text, []) == text
