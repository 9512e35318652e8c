"""``kbatch backfill`` with contract 1.2's tasks, end to end: redact a topic's history
(token-classify ``--redact``), re-index it with sparse vectors (``--top-k``), rerank each
record's documents (``--documents-field``); the real command and broker, tiny models built
here, the reference libraries to compare with."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from schemas.models import RerankResult, SparseResult, TokenClassifyResult
from schemas.sparse import decode_sparse
from tests.conftest import TopicFactory, unique_group
from tests.fixtures.task_models import (
    build_tiny_cross_encoder,
    build_tiny_splade,
    build_tiny_token_classifier,
)
from tests.integration.harness import read_all
from tests.integration.test_backfill import Event, backfill_args, produce_events, run_backfill

pytestmark = pytest.mark.integration

TEXTS = ["Sarah Connor met John in Los Angeles.", "Wolfgang lives in Berlin."]


async def test_backfill_redacts_and_sparse_encodes_a_topic(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    from sentence_transformers import SparseEncoder
    from transformers import pipeline

    source, out_ner, out_sparse, dlq = [
        await new_topic(n) for n in ("bft-src", "bft-ner", "bft-sparse", "bft-dlq")
    ]
    await produce_events(
        kafka_bootstrap,
        source,
        [Event(0, f"k{i}".encode(), t.encode()) for i, t in enumerate(TEXTS)],
    )
    ner = build_tiny_token_classifier(tmp_path / "ner")
    args = backfill_args(
        kafka_bootstrap, source, out_ner, dlq, unique_group("bft"), ner,
        "--task", "token-classify", "--redact", "--aggregation", "first",
    )  # fmt: skip
    run = run_backfill(args, tmp_path / "ner.log")
    assert run.code == 0, run.log[-3000:]
    reference = pipeline(
        "token-classification", model=str(ner), aggregation_strategy="first", device="cpu"
    )
    written = {r.key: r.reply for r in await read_all(kafka_bootstrap, out_ner, partitions=1)}
    for i, text in enumerate(TEXTS):
        result = written[f"k{i}".encode()].result
        assert isinstance(result, TokenClassifyResult)
        expected = reference(text)
        assert [(e.label, e.start, e.end) for e in result.entities] == [
            (e["entity_group"], e["start"], e["end"]) for e in expected
        ]
        assert result.redacted is not None and result.redacted != text

    splade = build_tiny_splade(tmp_path / "splade")
    args = backfill_args(
        kafka_bootstrap, source, out_sparse, dlq, unique_group("bft"), splade,
        "--task", "sparse", "--top-k", "8",
    )  # fmt: skip
    run = run_backfill(args, tmp_path / "sparse.log")
    assert run.code == 0, run.log[-3000:]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        top = SparseEncoder(str(splade), device="cpu").encode(
            TEXTS, convert_to_tensor=True, max_active_dims=8
        )
    dense = top.to_dense().numpy()
    written = {r.key: r.reply for r in await read_all(kafka_bootstrap, out_sparse, partitions=1)}
    for i in range(len(TEXTS)):
        result = written[f"k{i}".encode()].result
        assert isinstance(result, SparseResult)
        indices, values = decode_sparse(result.model_dump())
        (expected,) = np.nonzero(dense[i])
        assert indices.tolist() == expected.tolist() and len(expected) == 8
        np.testing.assert_allclose(values, dense[i][expected], atol=1e-5)


async def test_backfill_reranks_each_records_documents(
    tmp_path: Path, kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    from sentence_transformers import CrossEncoder

    source, output, dlq = [await new_topic(n) for n in ("bfr-src", "bfr-out", "bfr-dlq")]
    events = [
        {"q": "where are offsets committed?", "docs": ["In Kafka.", "Bananas.", "offsets"]},
        {"q": "fruit", "docs": ["Bananas are yellow."]},
        {"q": "no documents", "docs": []},  # a dead letter: 1 to 64 documents
    ]
    await produce_events(
        kafka_bootstrap,
        source,
        [Event(0, f"k{i}".encode(), json.dumps(e).encode()) for i, e in enumerate(events)],
    )
    model = build_tiny_cross_encoder(tmp_path / "ce")
    args = backfill_args(
        kafka_bootstrap, source, output, dlq, unique_group("bfr"), model,
        "--task", "rerank", "--text-field", "q", "--documents-field", "docs", "--top-n", "1",
    )  # fmt: skip
    run = run_backfill(args, tmp_path / "rerank.log")
    assert run.code == 0, run.log[-3000:]
    reference = CrossEncoder(str(model), device="cpu")
    written = {r.key: r.reply for r in await read_all(kafka_bootstrap, output, partitions=1)}
    assert set(written) == {b"k0", b"k1"}
    for i, event in enumerate(events[:2]):
        result = written[f"k{i}".encode()].result
        assert isinstance(result, RerankResult) and result.top is not None
        expected = reference.predict([(event["q"], d) for d in event["docs"]])
        np.testing.assert_allclose(result.scores, expected, atol=1e-5)
        assert result.top[0].index == int(np.argmax(expected))
    dead = await read_all(kafka_bootstrap, dlq, partitions=1, decode=False)
    assert [d.key for d in dead] == [b"k2"]
