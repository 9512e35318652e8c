"""``kbatch backfill``'s embed option flags (contract 1.1), applied to every record; with the
fakes of ``test_backfill_job``."""

from __future__ import annotations

import asyncio

import pytest

from consumer.backfill.job import BackfillJob
from consumer.options import ModelProfile
from consumer.replies.builder import ReplyBuilder
from schemas.codec import Encoding, decode_reply
from schemas.embedding import decode_embedding
from schemas.models import EmbedResult, ModelInfo
from tests.fakes import AnsweringEngine as FakeEngine
from tests.fakes import FakeRangeSource as FakeSource
from tests.fakes import FakeSink
from tests.unit.test_backfill_job import _record, _settings, _sink

PROFILE = ModelProfile(dim=2, normalizes=True, prompts={"query": "query: ", "doc": "doc: "})


def _run(**flags: object) -> tuple[FakeSink, FakeEngine]:
    source = FakeSource({0: [_record(0, o, f"text {o}".encode()) for o in range(3)]}, {0: 3})
    sink = _sink()
    settings = _settings(**flags)
    engine = FakeEngine()
    job = BackfillJob(
        settings, source, sink, ReplyBuilder(ModelInfo(name="m"), "dead", PROFILE), engine=engine
    )
    summary = asyncio.run(job.run(asyncio.Event()))
    assert summary.complete
    return sink, engine


def test_every_record_gets_the_prompt_and_the_encoding() -> None:
    sink, engine = _run(prompt_name="doc", encoding_format="f16le", dimensions=1)
    assert [it.text for it in engine.submitted] == [f"doc: text {o}" for o in range(3)]
    for out in sink.to("scores"):
        reply = decode_reply(out.value or b"", Encoding.MSGPACK)
        assert isinstance(reply.result, EmbedResult)
        assert (reply.result.format, reply.result.dim) == ("f16le", 1)
        assert decode_embedding(reply.result.embedding, "f16le", 1).tolist() == [1.0]
        assert reply.usage is not None and reply.usage.tokens == 3


def test_the_default_prompt_name_applies_without_flags() -> None:
    profile_default = ModelProfile(dim=2, prompts={"query": "q: "}, default_prompt_name="query")
    source = FakeSource({0: [_record(0, 0, b"hi")]}, {0: 1})
    engine = FakeEngine()
    job = BackfillJob(
        _settings(),
        source,
        _sink(),
        ReplyBuilder(ModelInfo(name="m"), "d", profile_default),
        engine=engine,
    )
    asyncio.run(job.run(asyncio.Event()))
    assert [it.text for it in engine.submitted] == ["q: hi"]


def test_options_change_the_jobs_group_but_a_job_without_options_keeps_its_own() -> None:
    plain = _settings().effective_group_id
    assert _settings(dimensions=8).effective_group_id != plain
    assert _settings(default_prompt_name="query").effective_group_id != plain
    assert (
        _settings(normalize=False).effective_group_id
        != _settings(normalize=True).effective_group_id
    )
    # the id a job without options had before contract 1.1
    import hashlib

    s = _settings()
    identity = "\0".join((s.range_from, s.range_to, "", s.model, "", s.task))
    assert plain.endswith(hashlib.sha256(identity.encode()).hexdigest()[:10])


def test_a_bad_option_value_is_refused_by_the_settings() -> None:
    with pytest.raises(ValueError):
        _settings(dimensions=0)
    with pytest.raises(ValueError):
        _settings(encoding_format="base64")


def test_the_embed_option_names_are_one_list_everywhere() -> None:
    """EMBED_OPTIONS names the options of a request, of EmbedOptions and of backfill's flags:
    a new option missing on one of them would be dropped silently on that path."""
    import dataclasses

    from consumer.backfill.config import BackfillSettings
    from consumer.options import EmbedOptions
    from schemas.codec import decode_request, encode_request
    from schemas.models import EMBED_OPTIONS, Request

    assert tuple(f.name for f in dataclasses.fields(EmbedOptions)) == EMBED_OPTIONS
    assert set(EMBED_OPTIONS) <= set(Request.model_fields) & set(BackfillSettings.model_fields)
    values = {"dimensions": 2, "normalize": False, "prompt_name": "q", "encoding_format": "f16le"}
    assert set(values) == set(EMBED_OPTIONS)
    request = Request(text="x", **values)  # type: ignore[arg-type]
    assert request.has_embed_options and EmbedOptions.of(request) == EmbedOptions(**values)  # type: ignore[arg-type]
    assert decode_request(encode_request(request)) == request
    assert _settings(**values).embed_options == EmbedOptions(**values)  # type: ignore[arg-type]


def test_chunk_flags_chunk_every_record_with_the_prompt_before_each_chunk() -> None:
    """Contract 1.3 through ``kbatch backfill --chunk-*``: each record runs as chunks (the
    fan-out's windower), its output record holds every chunk's vector and span."""
    from consumer.batching.fanout import FanOutEngine
    from consumer.model.tokenize import HFTokenizer
    from consumer.model.windows import ChunkWindows
    from schemas.models import ChunkedEmbedResult
    from tests.fixtures.tiny_models import minilm_dir

    text = "alpha beta gamma delta epsilon zeta eta theta iota kappa"
    source = FakeSource({0: [_record(0, o, text.encode()) for o in range(2)]}, {0: 2})
    sink = _sink()
    settings = _settings(chunk_max_tokens=8, chunk_output="chunks", prompt_name="doc")
    engine = FakeEngine()  # answers through the fan-out (the parts' callback)
    fanout = FanOutEngine(engine, windower=ChunkWindows(HFTokenizer(minilm_dir(), max_length=16)))
    job = BackfillJob(
        settings, source, sink, ReplyBuilder(ModelInfo(name="m"), "dead", PROFILE), engine=fanout
    )
    assert asyncio.run(job.run(asyncio.Event())).complete
    # 8 tokens: [CLS] [SEP], "doc :" and 4 words of text per chunk
    assert [it.text for it in engine.submitted][:3] == [
        "doc: alpha beta gamma delta", "doc: epsilon zeta eta theta", "doc: iota kappa"
    ]  # fmt: skip
    for out in sink.to("scores"):
        reply = decode_reply(out.value or b"", Encoding.MSGPACK)
        assert isinstance(reply.result, ChunkedEmbedResult)
        assert [(c.start, c.end) for c in reply.result.chunks] == [(0, 22), (23, 45), (46, 56)]
    assert _settings(chunk_output="pooled").effective_group_id != _settings().effective_group_id
    with pytest.raises(ValueError, match="chunk_"):
        _settings(task="classify", chunk_max_tokens=8)
