"""Contract 1.1 options end to end: a real ``kbatch serve`` (``--default-prompt-name``), the
real broker, the tiny embedder with prompts, and sentence-transformers as the reference."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgpack
import numpy as np
import pytest
from sentence_transformers import SentenceTransformer
from sentence_transformers.quantization import quantize_embeddings

from consumer.kafka.admin import create_topics, delete_topics
from producer_tools.client import RequestReplyClient
from schemas.codec import Encoding
from schemas.embedding import decode_embedding
from schemas.errors import ErrorCode
from schemas.models import ChunkedEmbedResult, EmbedResult, Reply
from tests.conftest import unique_group
from tests.integration.harness import (
    KBATCH,
    ReplyRecord,
    Req,
    ServeProcess,
    poll_until,
    produce,
    read_topic,
    request,
)

TEXT = "replies in compact bytes"


@dataclass(frozen=True)
class Served:
    bootstrap: str
    requests: str
    replies: str
    dlq: str
    server: ServeProcess
    st: SentenceTransformer


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str, tiny_prompt_embed_dir: Path
) -> Iterator[Served]:
    """One server for the module, default prompt ``passage``; topics of its own."""
    suffix = unique_group("o").rsplit(".", 1)[-1]
    requests, replies, dlq = (f"test.opt-{n}.{suffix}" for n in ("req", "rep", "dlq"))
    asyncio.run(create_topics(kafka_bootstrap, [requests, replies, dlq], partitions=1))
    server = ServeProcess.start(
        tmp_path_factory.mktemp("serve"),
        bootstrap=kafka_bootstrap,
        request_topic=requests,
        reply_topic=replies,
        dlq_topic=dlq,
        group_id=unique_group("options"),
        model=str(tiny_prompt_embed_dir),
        extra=["--max-wait-ms", "5", "--default-prompt-name", "passage"],
    )
    try:
        st = SentenceTransformer(str(tiny_prompt_embed_dir), device="cpu")
        server.wait_ready()
        yield Served(kafka_bootstrap, requests, replies, dlq, server, st)
    finally:
        server.stop()
        asyncio.run(delete_topics(kafka_bootstrap, [requests, replies, dlq]))


def _vector(reply: Reply) -> np.ndarray:  # type: ignore[type-arg]
    assert isinstance(reply.result, EmbedResult), reply
    return decode_embedding(reply.result.embedding, reply.result.format, reply.result.dim)


async def test_options_dedup_and_errors_through_kafka(served: Served) -> None:
    s = served
    bad = msgpack.packb({"text": TEXT, "normalize": 1})  # wrong type: invalid_request
    records = [
        request("plain", TEXT),  # the server's default prompt: passage
        request("plain", TEXT, dimensions=8, encoding_format="f32le"),  # derived from the first
        request("plain", TEXT, prompt_name="query", encoding_format="f16le"),  # other input
        request("bin", TEXT, Encoding.JSON, prompt_name="query", dimensions=20,
                encoding_format="binary"),
        request("too-many", TEXT, dimensions=999),  # invalid_option
        request("no-prompt", TEXT, prompt_name="document"),  # invalid_option
        Req(b"bad-type", bad),
    ]  # fmt: skip
    await produce(s.bootstrap, s.requests, records)
    got = await read_topic(s.bootstrap, s.replies, lambda rs: len(rs) >= 7, 90)
    by_key: dict[bytes, list[Reply]] = {}
    raw_by_key: dict[bytes, bytes] = {}
    for r in got:
        assert r.key is not None
        by_key.setdefault(r.key, []).append(r.reply)
        raw_by_key[r.key] = r.raw
    assert all(reply.model.contract == "1.4" for replies in by_key.values() for reply in replies)

    st = s.st
    passage = st.encode([TEXT], prompt_name="passage")[0]
    plain = sorted(by_key[b"plain"], key=lambda r: r.result.format if r.result else "")  # type: ignore[union-attr]
    assert [r.result.format for r in plain] == ["f16le", "f32le", "float"]  # type: ignore[union-attr]
    f16, f32, default = plain
    np.testing.assert_allclose(_vector(default), passage, atol=2e-6)
    eight = st.encode([TEXT], prompt_name="passage", truncate_dim=8, normalize_embeddings=True)
    np.testing.assert_allclose(_vector(f32), eight[0], atol=2e-6)
    query = st.encode([TEXT], prompt_name="query")[0]
    np.testing.assert_allclose(_vector(f16), query.astype(np.float16), atol=1e-3)
    assert (default.dedup, f32.dedup, f16.dedup) == (False, True, False)
    assert default.usage == f32.usage and default.usage is not None
    passage_ids = st.tokenizer("passage: " + TEXT)["input_ids"]
    assert default.usage.tokens == len(passage_ids)

    (binary,) = by_key[b"bin"]
    bits = quantize_embeddings(
        st.encode([TEXT], prompt_name="query", truncate_dim=20, normalize_embeddings=True),
        precision="ubinary",
    )[0]
    encoded = json.loads(raw_by_key[b"bin"])["result"]["embedding"]
    assert base64.b64decode(encoded, validate=True) == bits.tobytes()  # JSON: base64
    assert isinstance(binary.result, EmbedResult) and binary.result.dim == 20

    for key in (b"too-many", b"no-prompt"):
        (reply,) = by_key[key]
        assert reply.error is not None and reply.error.code is ErrorCode.INVALID_OPTION
    (bad_reply,) = by_key[b"bad-type"]
    assert bad_reply.error is not None and bad_reply.error.code is ErrorCode.INVALID_REQUEST
    dead = await read_topic(s.bootstrap, s.dlq, lambda rs: len(rs) >= 1, 30, decode=False)
    assert [d.key for d in dead] == [b"bad-type"]  # invalid_option is never a dead letter
    assert s.server.metrics()["kbatch_dedup_hits_total"] == 1


async def test_client_decodes_every_format_and_the_cli_prints_lists(served: Served) -> None:
    s = served
    async with RequestReplyClient(
        bootstrap=s.bootstrap, request_topic=s.requests, reply_topic=s.replies
    ) as client:
        f16 = await client.request(TEXT, "c-f16", prompt_name="query", encoding_format="f16le")
        packed = await client.request(TEXT, "c-bin", encoding_format="binary", dimensions=12)
    expected = s.st.encode([TEXT], prompt_name="query")[0]
    vector = f16.embedding()
    assert vector is not None and vector.dtype == np.float16
    np.testing.assert_allclose(vector, expected.astype(np.float16), atol=1e-3)
    bits, raw_bits = packed.embedding(), packed.embedding(unpack_bits=False)
    assert bits is not None and raw_bits is not None
    assert bits.shape == (12,) and raw_bits.shape == (2,)

    out = subprocess.run(
        [KBATCH, "request", TEXT, "--encoding-format", "f32le", "--dimensions", "4",
         "--no-normalize", "--bootstrap", s.bootstrap, "--request-topic", s.requests,
         "--reply-topic", s.replies],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    printed = json.loads(out.stdout)
    assert printed["result"]["format"] == "f32le" and printed["result"]["dim"] == 4
    raw_st = SentenceTransformer(modules=[s.st[0], s.st[1]], device="cpu")
    reference = raw_st.encode([TEXT], prompt="passage: ", truncate_dim=4)[0]
    np.testing.assert_allclose(printed["result"]["embedding"], reference, atol=2e-6)


async def test_priority_bulk_is_answered_and_an_invalid_priority_is_dead_lettered(
    served: Served,
) -> None:
    """Contract 1.2 ``priority``: a bulk request rides the bulk lane to its ok reply;
    a value other than live/bulk is invalid_request and a dead letter."""
    s = served
    records = [
        request("prio-bulk", "scored in the spare capacity", priority="bulk"),
        request("prio-live", "scored first", priority="live"),
        Req(b"prio-bad", msgpack.packb({"text": TEXT, "priority": "urgent"})),
    ]
    await produce(s.bootstrap, s.requests, records)
    mine = {b"prio-bulk", b"prio-live", b"prio-bad"}
    got = await read_topic(s.bootstrap, s.replies, lambda rs: mine <= {r.key for r in rs}, 90)
    by_key = {r.key: r.reply for r in got if r.key in mine}
    assert by_key[b"prio-bulk"].status == "ok" and by_key[b"prio-live"].status == "ok"
    bad = by_key[b"prio-bad"]
    assert bad.error is not None and bad.error.code is ErrorCode.INVALID_REQUEST
    dead = await read_topic(
        s.bootstrap, s.dlq, lambda rs: b"prio-bad" in {d.key for d in rs}, 30, decode=False
    )
    assert b"prio-bad" in {d.key for d in dead}
    bulk_ok = 'kbatch_lane_replies_total{lane="bulk",status="ok"}'
    # counted on the broker's ack, which may come after the reply is readable
    poll_until(lambda: s.server.metrics().get(bulk_ok, 0) >= 1, 30, "the bulk reply's count")
    metrics = s.server.metrics()
    assert metrics[bulk_ok] == 1
    assert metrics['kbatch_queue_wait_seconds_count{lane="bulk"}'] == 1


async def test_chunked_embeddings_through_kafka(served: Served) -> None:
    """Contract 1.3 ``chunking`` end to end: each chunk = ``encode`` of its text with the
    default prompt; the pooled vector their token-weighted mean, re-normalised; a JSON copy
    asking for f32le chunks is derived from the same computation; over the model: invalid_option."""
    s = served
    text = " ".join(
        f"chunk {i}: Zürich offsets, naïve consumers and 東京 brokers." for i in range(12)
    )
    chunking = {"max_tokens": 32, "overlap": 4}
    await produce(
        s.bootstrap,
        s.requests,
        [
            request("doc", text, chunking={**chunking, "output": "chunks"}),
            request("doc", text, Encoding.JSON, encoding_format="f32le", chunking=chunking),
            request("too-big", text, chunking={"max_tokens": 4096}),
        ],
    )
    wanted = [b"doc", b"doc", b"too-big"]  # the module's topic holds other tests' replies

    def arrived(rs: list[ReplyRecord]) -> bool:
        return sorted(r.key for r in rs if r.key in wanted) == sorted(wanted)

    got = await read_topic(s.bootstrap, s.replies, arrived, 90)
    by_key: dict[bytes, list[Reply]] = {}
    for r in got:
        assert r.key is not None
        by_key.setdefault(r.key, []).append(r.reply)
    chunked, pooled = sorted(by_key[b"doc"], key=lambda r: r.dedup)
    assert isinstance(chunked.result, ChunkedEmbedResult), chunked.error
    assert not chunked.dedup and pooled.dedup
    pieces = [text[c.start : c.end] for c in chunked.result.chunks]
    assert len(pieces) > 3
    expected = s.st.encode(pieces, prompt_name="passage")
    np.testing.assert_allclose([c.embedding for c in chunked.result.chunks], expected, atol=2e-6)
    weights = [len(s.st.tokenizer("passage: " + p)["input_ids"]) for p in pieces]
    assert chunked.usage is not None and chunked.usage.tokens == sum(weights)
    mean = np.average(expected, axis=0, weights=weights)
    np.testing.assert_allclose(_vector(pooled), mean / np.linalg.norm(mean), atol=2e-6)
    (too_big,) = by_key[b"too-big"]
    assert too_big.error is not None and too_big.error.code is ErrorCode.INVALID_OPTION


async def test_chunks_in_bytes_are_answered_in_json_as_in_msgpack(served: Served) -> None:
    """``output: "chunks"`` with a bytes ``encoding_format`` in a JSON request: each chunk's
    bytes are base64 in the JSON reply and decode to the vectors the msgpack reply carries."""
    s = served
    text = " ".join(f"part {i}: offsets, consumers and brokers." for i in range(8))
    formats = ("f32le", "f16le", "binary")
    chunking = {"max_tokens": 16, "output": "chunks"}
    await produce(
        s.bootstrap,
        s.requests,
        [
            request(
                f"{encoding.name}-{fmt}", text, encoding, encoding_format=fmt, chunking=chunking
            )
            for fmt in formats
            for encoding in (Encoding.JSON, Encoding.MSGPACK)
        ],
    )
    wanted = {f"{e}-{f}".encode() for f in formats for e in ("JSON", "MSGPACK")}
    got = await read_topic(s.bootstrap, s.replies, lambda rs: wanted <= {r.key for r in rs}, 90)
    by_key = {r.key: r for r in got if r.key in wanted}
    for fmt in formats:
        in_json, in_msgpack = by_key[f"JSON-{fmt}".encode()], by_key[f"MSGPACK-{fmt}".encode()]
        assert in_json.headers["content-type"] == b"application/json"
        assert isinstance(in_json.reply.result, ChunkedEmbedResult), in_json.reply.error
        assert isinstance(in_msgpack.reply.result, ChunkedEmbedResult), in_msgpack.reply.error
        raw_chunks = json.loads(in_json.raw)["result"]["chunks"]
        assert all(isinstance(c["embedding"], str) for c in raw_chunks)  # base64
        json_chunks, msgpack_chunks = in_json.reply.result.chunks, in_msgpack.reply.result.chunks
        assert len(json_chunks) == len(msgpack_chunks) > 1
        dim = in_json.reply.result.dim
        for a, b in zip(json_chunks, msgpack_chunks, strict=True):
            assert (a.start, a.end) == (b.start, b.end)
            assert isinstance(a.embedding, bytes) and len(a.embedding) == len(b.embedding)
            np.testing.assert_allclose(
                decode_embedding(a.embedding, fmt, dim).astype(np.float32),
                decode_embedding(b.embedding, fmt, dim).astype(np.float32),
                atol=1e-3,
            )
