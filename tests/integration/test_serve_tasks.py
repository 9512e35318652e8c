"""Contract 1.2's tasks end to end: one real ``kbatch serve --task …`` per task on a tiny model
built here, the real broker, a few requests each; results against the reference libraries
(the full parity tables are ``tests/unit/test_task_parity.py``)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from consumer.batching.types import InferenceItem
from consumer.kafka.admin import create_topics, delete_topics
from consumer.model.tokenize import HFTokenizer
from consumer.model.windows import PairWindows
from producer_tools.client import RequestReplyClient
from schemas.codec import Encoding
from schemas.errors import ErrorCode
from schemas.models import Reply, RerankResult, SparseResult, TokenClassifyResult
from schemas.sparse import decode_sparse
from tests.conftest import unique_group
from tests.fixtures.task_models import (
    build_tiny_cross_encoder,
    build_tiny_splade,
    build_tiny_token_classifier,
)
from tests.integration.harness import KBATCH, Req, ServeProcess, produce, read_topic, request

DOCUMENTS = ["Consumers commit offsets to Kafka.", "Bananas are yellow.", "offsets", "x " * 30]
LONG_DOC = " ".join(
    f"Paragraph {i}: brokers, Zürich offsets and naïve consumers." for i in range(40)
)
"""Contract 1.3: a document of several 128-token windows."""
TEXT = "Sarah Connor met John in Los Angeles."


@pytest.fixture
def serve_task(
    tmp_path: Path, kafka_bootstrap: str
) -> Iterator[tuple[str, str, str, list[ServeProcess]]]:
    """Topics of the test's own; the servers the test starts are stopped afterwards."""
    suffix = unique_group("t").rsplit(".", 1)[-1]
    topics = [f"test.task-{n}.{suffix}" for n in ("req", "rep", "dlq")]
    asyncio.run(create_topics(kafka_bootstrap, topics, partitions=1))
    servers: list[ServeProcess] = []
    try:
        yield topics[0], topics[1], topics[2], servers
    finally:
        for server in servers:
            server.stop()
        asyncio.run(delete_topics(kafka_bootstrap, topics))


def start(
    serve_task: tuple[str, str, str, list[ServeProcess]],
    tmp_path: Path,
    bootstrap: str,
    model: Path,
    task: str,
    extra: tuple[str, ...] = (),
) -> ServeProcess:
    requests, replies, dlq, servers = serve_task
    server = ServeProcess.start(
        tmp_path,
        bootstrap=bootstrap,
        request_topic=requests,
        reply_topic=replies,
        dlq_topic=dlq,
        group_id=unique_group(task),
        model=str(model),
        task=task,
        extra=["--max-wait-ms", "5", *extra],
    )
    servers.append(server)
    server.wait_ready()
    return server


async def replies_by_key(bootstrap: str, topic: str, n: int) -> dict[bytes, list[Reply]]:
    got = await read_topic(bootstrap, topic, lambda rs: len(rs) >= n, 90)
    out: dict[bytes, list[Reply]] = {}
    for r in got:
        assert r.key is not None
        out.setdefault(r.key, []).append(r.reply)
    return out


async def test_rerank_through_kafka(
    serve_task: tuple[str, str, str, list[ServeProcess]], tmp_path: Path, kafka_bootstrap: str
) -> None:
    from sentence_transformers import CrossEncoder

    model = build_tiny_cross_encoder(tmp_path / "ce")
    server = start(serve_task, tmp_path, kafka_bootstrap, model, "rerank")
    requests, replies, _, _ = serve_task
    query = "where are offsets committed?"
    await produce(
        kafka_bootstrap,
        requests,
        [
            request("r", query, documents=DOCUMENTS),
            request("r", query, Encoding.JSON, documents=DOCUMENTS, top_n=2),  # dedup copy
            request("no-docs", query),  # invalid_option
            request("wrong", query, documents=DOCUMENTS, top_k=3),  # a sparse option
            request("long", query, documents=[DOCUMENTS[0], LONG_DOC], top_n=2),  # 1.3: MaxP
            request("cut", query, documents=[LONG_DOC], truncate=True),  # 1.2: one cut pair
        ],
    )
    by_key = await replies_by_key(kafka_bootstrap, replies, 6)
    expected = CrossEncoder(str(model), device="cpu").predict([(query, d) for d in DOCUMENTS])
    plain, top = sorted(by_key[b"r"], key=lambda r: r.dedup)
    assert isinstance(plain.result, RerankResult) and isinstance(top.result, RerankResult)
    np.testing.assert_allclose(plain.result.scores, expected, atol=1e-5)
    assert plain.result.top is None and top.dedup
    assert top.result.top is not None
    assert [d.index for d in top.result.top] == np.argsort(-expected, kind="stable")[:2].tolist()
    assert plain.model.contract == "1.4" and plain.usage is not None
    assert plain.timing is not None and plain.usage.tokens > len(DOCUMENTS) * 3
    for key in (b"no-docs", b"wrong"):
        (reply,) = by_key[key]
        assert reply.error is not None and reply.error.code is ErrorCode.INVALID_OPTION
    assert server.metrics()["kbatch_dedup_hits_total"] == 1
    # contract 1.3: the long document scores its best window (CrossEncoder on that pair)
    (long,) = by_key[b"long"]
    assert isinstance(long.result, RerankResult) and long.result.top is not None
    assert not long.truncated
    (pairs,) = PairWindows(HFTokenizer(model)).split(
        [InferenceItem(0, query, documents=(DOCUMENTS[0], LONG_DOC))]
    )
    assert isinstance(pairs, list) and len(pairs) > 3
    windows = [p.window for p in pairs[1:] if p.window is not None]
    scores = CrossEncoder(str(model), device="cpu").predict(
        [(query, LONG_DOC[w.start : w.end]) for w in windows]
    )
    best = int(np.argmax(scores))
    np.testing.assert_allclose(long.result.scores, [expected[0], scores[best]], atol=1e-5)
    (entry,) = [e for e in long.result.top if e.index == 1]
    assert entry.window is not None and (entry.window.index, entry.window.count) == (
        best, len(windows)
    )  # fmt: skip
    assert (
        LONG_DOC[entry.window.start : entry.window.end]
        == LONG_DOC[windows[best].start : windows[best].end]
    )
    (cut,) = by_key[b"cut"]
    assert cut.truncated and isinstance(cut.result, RerankResult)
    cut_expected = CrossEncoder(str(model), device="cpu").predict([(query, LONG_DOC)])
    np.testing.assert_allclose(cut.result.scores, cut_expected, atol=1e-5)
    # kbatch request: --document per document, --top-n
    out = subprocess.run(
        [KBATCH, "request", query, "--task", "rerank", "--top-n", "1",
         *(arg for d in DOCUMENTS[:2] for arg in ("--document", d)),
         "--bootstrap", kafka_bootstrap, "--request-topic", requests, "--reply-topic", replies],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    cli = json.loads(out.stdout)["result"]
    np.testing.assert_allclose(cli["scores"], expected[:2], atol=1e-5)
    assert cli["top"] == [{"index": int(np.argmax(expected[:2])), "score": max(cli["scores"])}]


async def test_sparse_through_kafka(
    serve_task: tuple[str, str, str, list[ServeProcess]], tmp_path: Path, kafka_bootstrap: str
) -> None:
    from sentence_transformers import SparseEncoder

    model = build_tiny_splade(tmp_path / "splade")
    start(serve_task, tmp_path, kafka_bootstrap, model, "sparse")
    requests, replies, _, _ = serve_task
    texts = {"a": "sparse vectors for hybrid search", "b": "Kafka"}
    await produce(
        kafka_bootstrap,
        requests,
        [
            request("a", texts["a"]),
            request("b", texts["b"], Encoding.JSON, encoding_format="f32le", top_k=8),
            request("bin", texts["b"], encoding_format="binary"),  # invalid_option
        ],
    )
    by_key = await replies_by_key(kafka_bootstrap, replies, 3)
    reference = SparseEncoder(str(model), device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = reference.encode([texts["a"]], convert_to_tensor=True).to_dense()[0].numpy()
        top = reference.encode([texts["b"]], convert_to_tensor=True, max_active_dims=8)
    for key, dense in ((b"a", full), (b"b", top.to_dense()[0].numpy())):
        (reply,) = by_key[key]
        assert isinstance(reply.result, SparseResult), reply
        indices, values = decode_sparse(reply.result.model_dump())
        (expected,) = np.nonzero(dense)
        assert indices.tolist() == expected.tolist()
        np.testing.assert_allclose(values, dense[expected], atol=1e-5)
    (bad,) = by_key[b"bin"]
    assert bad.error is not None and bad.error.code is ErrorCode.INVALID_OPTION
    async with RequestReplyClient(
        bootstrap=kafka_bootstrap, request_topic=requests, reply_topic=replies
    ) as client:
        envelope = await client.request(texts["a"], "client", encoding_format="f16le")
    got = envelope.sparse()
    assert got is not None and got[1].dtype == np.float16
    (expected,) = np.nonzero(full)
    assert got[0].tolist() == expected.tolist()
    np.testing.assert_allclose(got[1], full[expected], atol=2e-3)
    assert envelope.to_json()["reply"]["result"]["indices"] == expected.tolist()


async def test_token_classify_and_redaction_through_kafka(
    serve_task: tuple[str, str, str, list[ServeProcess]], tmp_path: Path, kafka_bootstrap: str
) -> None:
    from transformers import pipeline

    model = build_tiny_token_classifier(tmp_path / "ner")
    windows = ("--window-stride", "16", "--max-windows", "4")
    start(serve_task, tmp_path, kafka_bootstrap, model, "token-classify", windows)
    requests, replies, _, _ = serve_task
    long_text = "Wolfgang lives in Berlin. " * 40  # 3 windows of 128 tokens (stride 16)
    huge_text = long_text * 3  # 7 windows: over --max-windows 4
    await produce(
        kafka_bootstrap,
        requests,
        [
            request("t", TEXT, redact=True),
            request("first", TEXT, aggregation="first"),
            request("long", long_text, redact=True),  # contract 1.3: windows
            request("whole", long_text, truncate=False),  # windows cut nothing: not refused
            request("cut", long_text, truncate=True),  # 1.2's first window
            request("cut-redact", long_text, truncate=True, redact=True),  # never cut
            request("huge", huge_text),  # input_too_long
            Req(b"dims", request("dims", TEXT, dimensions=4).value),  # an embed option
        ],
    )
    by_key = await replies_by_key(kafka_bootstrap, replies, 8)
    for key, strategy in ((b"t", "simple"), (b"first", "first")):
        expected = pipeline(
            "token-classification", model=str(model), aggregation_strategy=strategy, device="cpu"
        )(TEXT)
        (reply,) = by_key[key]
        assert isinstance(reply.result, TokenClassifyResult), reply
        got = reply.result.entities
        assert [(e.label, e.start, e.end) for e in got] == [
            (e["entity_group"], e["start"], e["end"]) for e in expected
        ]
        assert got and all(e.text == TEXT[e.start : e.end] for e in got)
    (redacted,) = by_key[b"t"]
    assert isinstance(redacted.result, TokenClassifyResult)
    assert redacted.result.redacted is not None
    assert all(f"[{e.label}]" in redacted.result.redacted for e in redacted.result.entities)
    reference = pipeline(
        "token-classification", model=str(model), aggregation_strategy="simple", stride=16,
        device="cpu",
    )  # fmt: skip
    reference.tokenizer.model_max_length = 128  # the model's (its position table), as kbatch's
    strided = reference(long_text)
    assert max(e["end"] for e in strided) > len(long_text) * 3 // 4  # the tail is scanned
    for key in (b"long", b"whole", b"cut-redact"):
        (reply,) = by_key[key]
        assert not reply.truncated and isinstance(reply.result, TokenClassifyResult), reply
        got = reply.result.entities
        assert [(e.label, e.start, e.end) for e in got] == [
            (e["entity_group"], e["start"], e["end"]) for e in strided
        ]
    (cut,) = by_key[b"cut"]
    assert cut.truncated and isinstance(cut.result, TokenClassifyResult)
    assert max(e.end for e in cut.result.entities) < max(e["end"] for e in strided) * 3 // 4
    (huge,) = by_key[b"huge"]
    assert huge.error is not None and huge.error.code is ErrorCode.INPUT_TOO_LONG
    (dims,) = by_key[b"dims"]
    assert dims.error is not None and dims.error.code is ErrorCode.INVALID_OPTION
