"""Contract 1.1 options on tiny real models, against sentence-transformers itself.

Each request goes the serving path without Kafka: option check and prompt
(:func:`consumer.options.admit_options`), the real tokenizer and torch runner
(:func:`consumer.serve.app.load_model`), the reply builder, the codec, and back through
``decode_reply``. The reference is computed here with ``SentenceTransformer(model_dir).encode``
(``prompt_name``, ``normalize_embeddings``, ``truncate_dim``) and
``quantize_embeddings(..., precision="ubinary")``. The two models share their weights; one has
a ``Normalize`` module, the other not (and ``query`` as its default prompt).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from sentence_transformers import SentenceTransformer
from sentence_transformers.quantization import quantize_embeddings

from consumer.batching.stats import EngineStats
from consumer.batching.types import Batch, InferenceItem, ItemOutcome, Rejected, TokenizedItem
from consumer.config import ModelSettings
from consumer.model.loader import LoadedModel, load_model
from consumer.options import EmbedOptions, OptionError, admit_options, prompted_text
from consumer.replies.builder import ReplyBuilder
from schemas.codec import Encoding, decode_reply
from schemas.embedding import decode_embedding
from schemas.models import EmbedResult, Reply, Request
from schemas.records import ParsedRequest, ReplyAddress
from tests.fixtures.tiny_models import EMBED_MAX_SEQ_LENGTH, PROMPTS

TEXT = "Kafka consumers batch requests by token length."
LONG = "word " * 200


@pytest.fixture(scope="module")
def normalizing(tiny_prompt_embed_dir: Path) -> tuple[LoadedModel, SentenceTransformer]:
    return _load(tiny_prompt_embed_dir)


@pytest.fixture(scope="module")
def raw(tiny_raw_embed_dir: Path) -> tuple[LoadedModel, SentenceTransformer]:
    return _load(tiny_raw_embed_dir)


def _load(model_dir: Path) -> tuple[LoadedModel, SentenceTransformer]:
    settings = ModelSettings(model=str(model_dir), device="cpu", torch_threads=1)
    model = load_model(settings, EngineStats(keep=1), max_length=None, truncate=True)
    return model, SentenceTransformer(str(model_dir), device="cpu")


def serve(model: LoadedModel, encoding: Encoding = Encoding.MSGPACK, **fields: Any) -> Reply:
    """One request through option check, tokenizer, runner, reply builder and codec."""
    request = Request(text=fields.pop("text", TEXT), **fields)
    prompt = admit_options(EmbedOptions.of(request), model.profile)
    item = InferenceItem(0, prompted_text(request.text, prompt, model.profile), request.truncate)
    (tokenized,) = model.tokenizer.tokenize([item])
    assert isinstance(tokenized, TokenizedItem)
    (run,) = model.runner.run(Batch([tokenized], tokenized.n_tokens, 0.0))
    outcome = ItemOutcome(0, "ok", run.result, None, None, tokenized.truncated,
                          tokenized.n_tokens, 0.0, run.infer_ms, 1, tokenized.n_tokens)  # fmt: skip
    builder = ReplyBuilder(model.info, "dlq", model.profile)
    parsed = ParsedRequest(b"k", request, ReplyAddress(), encoding)
    record = builder.from_outcome(parsed, outcome, dedup=False)
    return decode_reply(record.value or b"", encoding)


def vector(reply: Reply, unpack_bits: bool = True) -> npt.NDArray[Any]:
    result = reply.result
    assert isinstance(result, EmbedResult)
    return decode_embedding(result.embedding, result.format, result.dim, unpack_bits=unpack_bits)


def without_normalize(st: SentenceTransformer) -> SentenceTransformer:
    """The same model without its Normalize module: the raw pooled vector."""
    return SentenceTransformer(modules=[st[0], st[1]], device="cpu")


@pytest.mark.parametrize(
    ("fields", "reference"),
    [
        ({}, {}),
        ({"prompt_name": "query"}, {"prompt_name": "query"}),
        ({"prompt_name": "passage", "normalize": True}, {"prompt_name": "passage"}),
        ({"dimensions": 20}, {"truncate_dim": 20, "normalize_embeddings": True}),
        ({"dimensions": 32}, {}),
        ({"text": LONG, "prompt_name": "query"}, {"prompt_name": "query"}),  # truncated
    ],
    ids=["default", "prompt", "prompt-normalize", "dimensions", "all-dimensions", "truncated"],
)
def test_normalizing_model_matches_sentence_transformers(
    normalizing: tuple[LoadedModel, SentenceTransformer],
    fields: dict[str, Any],
    reference: dict[str, Any],
) -> None:
    model, st = normalizing
    text = fields.get("text", TEXT)
    reply = serve(model, **fields)
    expected = st.encode([text], **reference)[0]
    np.testing.assert_allclose(vector(reply), expected, rtol=0, atol=2e-6)
    assert isinstance(reply.result, EmbedResult) and reply.result.dim == expected.shape[0]
    assert reply.truncated is (text == LONG)


def test_normalize_false_on_a_normalizing_model_is_the_raw_pooled_vector(
    normalizing: tuple[LoadedModel, SentenceTransformer],
) -> None:
    model, st = normalizing
    reply = serve(model, normalize=False, prompt_name="query", dimensions=12)
    raw_st = without_normalize(st)
    expected = raw_st.encode([TEXT], prompt=PROMPTS["query"], truncate_dim=12)[0]
    np.testing.assert_allclose(vector(reply), expected, rtol=0, atol=2e-6)
    assert abs(float(np.linalg.norm(vector(reply))) - 1.0) > 1e-3  # really not normalised


@pytest.mark.parametrize(
    ("fields", "reference"),
    [
        ({}, {}),  # the model's default prompt (query), no normalisation
        ({"prompt_name": "passage"}, {"prompt_name": "passage"}),
        ({"normalize": True}, {"normalize_embeddings": True}),
        ({"dimensions": 8}, {"truncate_dim": 8}),
        ({"dimensions": 8, "normalize": True}, {"truncate_dim": 8, "normalize_embeddings": True}),
    ],
    ids=["default-prompt", "prompt", "normalize", "dimensions", "dimensions-normalize"],
)
def test_model_without_normalize_matches_sentence_transformers(
    raw: tuple[LoadedModel, SentenceTransformer],
    fields: dict[str, Any],
    reference: dict[str, Any],
) -> None:
    model, st = raw
    assert model.profile.default_prompt_name == "query"
    reply = serve(model, **fields)
    expected = st.encode([TEXT], **reference)[0]
    np.testing.assert_allclose(vector(reply), expected, rtol=0, atol=2e-6)


@pytest.mark.parametrize("encoding", [Encoding.MSGPACK, Encoding.JSON], ids=["msgpack", "json"])
@pytest.mark.parametrize("dimensions", [None, 20])
def test_encodings_match_sentence_transformers(
    normalizing: tuple[LoadedModel, SentenceTransformer],
    encoding: Encoding,
    dimensions: int | None,
) -> None:
    model, st = normalizing
    options: dict[str, Any] = {"prompt_name": "query", "dimensions": dimensions}
    truncate = {"truncate_dim": dimensions, "normalize_embeddings": True}
    expected = st.encode([TEXT], prompt_name="query", **truncate)
    dim = expected.shape[1]

    f32 = serve(model, encoding, encoding_format="f32le", **options)
    np.testing.assert_allclose(vector(f32), expected[0], rtol=0, atol=2e-6)
    assert vector(f32).dtype == np.float32

    f16 = serve(model, encoding, encoding_format="f16le", **options)
    assert vector(f16).dtype == np.float16
    np.testing.assert_allclose(vector(f16), expected[0].astype(np.float16), rtol=0, atol=1e-3)

    binary = serve(model, encoding, encoding_format="binary", **options)
    reference_bits = quantize_embeddings(expected, precision="ubinary")[0]
    assert isinstance(binary.result, EmbedResult) and binary.result.dim == dim
    assert vector(binary, unpack_bits=False).tobytes() == reference_bits.tobytes()
    assert len(reference_bits) == (dim + 7) // 8
    np.testing.assert_array_equal(vector(binary), (expected[0] > 0).astype(np.uint8))


def test_bytes_are_msgpack_bin_and_json_base64(
    normalizing: tuple[LoadedModel, SentenceTransformer],
) -> None:
    import msgpack

    model, _ = normalizing
    parsed = ParsedRequest(b"k", Request(text=TEXT, encoding_format="f16le"), ReplyAddress(),
                           Encoding.JSON)  # fmt: skip
    reply = serve(model, Encoding.MSGPACK, encoding_format="f16le")
    assert isinstance(reply.result, EmbedResult)
    raw_bytes = reply.result.embedding
    builder = ReplyBuilder(model.info, "dlq", model.profile)
    outcome = _outcome_of(model, TEXT)
    json_value = json.loads(builder.from_outcome(parsed, outcome, dedup=False).value or b"")
    assert base64.b64decode(json_value["result"]["embedding"], validate=True) == raw_bytes
    assert json_value["result"]["format"] == "f16le" and json_value["result"]["dim"] == 32
    packed = builder.from_outcome(
        ParsedRequest(b"k", parsed.request, ReplyAddress(), Encoding.MSGPACK), outcome, dedup=False
    ).value
    assert msgpack.unpackb(packed or b"", raw=False)["result"]["embedding"] == raw_bytes  # bin
    assert b"\xc4\x40" + raw_bytes in (packed or b"")  # bin 8, 64 bytes


def _outcome_of(model: LoadedModel, text: str) -> ItemOutcome:
    (tokenized,) = model.tokenizer.tokenize([InferenceItem(0, text)])
    assert isinstance(tokenized, TokenizedItem)
    (run,) = model.runner.run(Batch([tokenized], tokenized.n_tokens, 0.0))
    return ItemOutcome(0, "ok", run.result, None, None, False, tokenized.n_tokens, 0.0, 0.0, 1, 1)


def test_usage_counts_prompt_and_special_tokens_after_truncation(
    normalizing: tuple[LoadedModel, SentenceTransformer],
) -> None:
    model, st = normalizing
    for text, prompt in [(TEXT, None), (TEXT, "query"), (LONG, "query")]:
        fields: dict[str, Any] = {"text": text, "prompt_name": prompt}
        reply = serve(model, **fields)
        full = (PROMPTS[prompt] if prompt else "") + text
        ids = st.tokenizer(full, truncation=True, max_length=st.max_seq_length)["input_ids"]
        assert reply.usage is not None and reply.usage.tokens == len(ids)
    assert reply.usage.tokens == EMBED_MAX_SEQ_LENGTH


def test_input_too_long_counts_the_prompt(
    normalizing: tuple[LoadedModel, SentenceTransformer],
) -> None:
    model, _ = normalizing
    text = "word " * 30  # 32 tokens alone: fits in 64
    alone = model.tokenizer.tokenize([InferenceItem(0, text, truncate=False)])
    assert isinstance(alone[0], TokenizedItem)
    prompted = prompted_text(text, "long", model.profile)
    (rejected,) = model.tokenizer.tokenize([InferenceItem(0, prompted, truncate=False)])
    assert isinstance(rejected, Rejected) and rejected.n_tokens > EMBED_MAX_SEQ_LENGTH


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"dimensions": 33}, "dimensions is 33"),
        ({"prompt_name": "document"}, "unknown prompt_name 'document'"),
    ],
)
def test_what_the_model_cannot_do_is_an_option_error(
    normalizing: tuple[LoadedModel, SentenceTransformer], fields: dict[str, Any], message: str
) -> None:
    model, _ = normalizing
    with pytest.raises(OptionError, match=message):
        admit_options(EmbedOptions.of(Request(text="x", **fields)), model.profile)
