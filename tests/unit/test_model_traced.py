"""The torch backend's traced network (consumer/model/traced.py): the same outputs as eager on
every batch and sequence size, the fallback to eager, and the ``torch_trace`` setting."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from consumer.batching.stats import EngineStats
from consumer.batching.types import InferenceItem, TokenizedItem
from consumer.model.batch_runner import ModelRunner
from consumer.model.loader import load_model, load_runner
from consumer.model.settings import ModelSettings
from consumer.model.tokenize import HFTokenizer
from consumer.model.torch_backend import CPU_BF16_MIN_PADDED_TOKENS, TorchBackend
from consumer.model.traced import PARITY_ATOL, trace_network

TEXTS = [
    "ok",
    "The movie was surprisingly good, and the cast was wonderful.",
    "",
    "terrible " * 20,
    "A mid-length sentence about Kafka consumers and padded batches.",
    "short one",
    "x " * 40,
]
# (rows, extra padding beyond the longest row): batch and sequence sizes unlike the trace's
SHAPES = [(1, 0), (2, 5), (3, 0), (7, 0), (7, 9)]


def _items(model_dir: Path, texts: list[str]) -> list[TokenizedItem]:
    out = HFTokenizer(model_dir).tokenize([InferenceItem(i, t) for i, t in enumerate(texts)])
    assert all(isinstance(r, TokenizedItem) for r in out)
    return out  # type: ignore[return-value]


def _run(runner: ModelRunner, items: list[TokenizedItem], extra: int) -> list[dict[str, Any]]:
    backend = runner.backend
    return backend.forward(backend.prepare(items, max(t.n_tokens for t in items) + extra))


def _pair(model_dir: Path) -> tuple[ModelRunner, ModelRunner]:
    traced = load_runner(model_dir, device="cpu")
    eager = load_runner(model_dir, device="cpu", trace=False)
    assert isinstance(traced.backend, TorchBackend) and traced.backend.traced is not None
    assert isinstance(eager.backend, TorchBackend) and eager.backend.traced is None
    return traced, eager


@pytest.fixture(scope="module")
def embed_pair(tiny_embed_dir: Path) -> tuple[ModelRunner, ModelRunner]:
    return _pair(tiny_embed_dir)


@pytest.fixture(scope="module")
def classify_pair(tiny_classify_dir: Path) -> tuple[ModelRunner, ModelRunner]:
    return _pair(tiny_classify_dir)


@pytest.mark.parametrize(("rows", "extra"), SHAPES)
def test_traced_embeddings_equal_eager(
    tiny_embed_dir: Path, embed_pair: tuple[ModelRunner, ModelRunner], rows: int, extra: int
) -> None:
    traced, eager = embed_pair
    items = _items(tiny_embed_dir, TEXTS[:rows])
    got, want = _run(traced, items, extra), _run(eager, items, extra)
    for g, w in zip(got, want, strict=True):
        assert g["dim"] == w["dim"]
        np.testing.assert_allclose(g["embedding"], w["embedding"], atol=PARITY_ATOL, rtol=0)
        np.testing.assert_allclose(g["pooled"], w["pooled"], atol=PARITY_ATOL, rtol=0)


@pytest.mark.parametrize(("rows", "extra"), SHAPES)
def test_traced_labels_equal_eager(
    tiny_classify_dir: Path,
    classify_pair: tuple[ModelRunner, ModelRunner],
    rows: int,
    extra: int,
) -> None:
    traced, eager = classify_pair
    items = _items(tiny_classify_dir, TEXTS[:rows])
    got, want = _run(traced, items, extra), _run(eager, items, extra)
    for g, w in zip(got, want, strict=True):
        assert g["label"] == w["label"]
        for label, p in w["scores"].items():
            assert g["scores"][label] == pytest.approx(p, abs=PARITY_ATOL)


def test_padding_does_not_change_a_traced_answer(
    tiny_embed_dir: Path, embed_pair: tuple[ModelRunner, ModelRunner]
) -> None:
    """A row alone, and the same row padded next to a longer neighbour, through the trace."""
    traced, _ = embed_pair
    short, long = _items(tiny_embed_dir, ["short one", "x " * 40])
    alone = _run(traced, [short], 0)[0]["embedding"]
    padded = _run(traced, [short, long], 0)[0]["embedding"]
    np.testing.assert_allclose(alone, padded, atol=PARITY_ATOL, rtol=0)


class _Drifting(torch.nn.Module):
    """Returns a different answer at every call: a trace freezes the Python counter."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.linear = torch.nn.Linear(1, 4)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any:
        self.calls += 1
        logits = self.linear(input_ids[:, :1].float()) + self.calls
        return type("Out", (), {"logits": logits})()


class _Untraceable(torch.nn.Module):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any:
        raise RuntimeError("no tracing here")


def test_a_trace_unlike_eager_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="consumer.model.traced"):
        assert trace_network(_Drifting(), "classify", token_id=5, pad_id=0) is None
    assert "differs from eager" in caplog.text


def test_a_failed_trace_leaves_the_model_eager(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="consumer.model.traced"):
        assert trace_network(_Untraceable(), "embed", token_id=5, pad_id=0) is None
    assert "torch trace failed (RuntimeError: no tracing here)" in caplog.text


def test_a_traced_forward_that_fails_runs_eager_from_then_on(
    tiny_embed_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    traced, eager = _pair(tiny_embed_dir)
    backend = traced.backend
    assert isinstance(backend, TorchBackend)
    calls: list[int] = []

    def broken(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        raise RuntimeError("graph broke")

    backend.traced = broken
    items = _items(tiny_embed_dir, TEXTS[:3])
    with caplog.at_level(logging.WARNING, logger="consumer.model.torch_backend"):
        got = _run(traced, items, 0)
        again = _run(traced, items, 0)
    want = _run(eager, items, 0)
    assert backend.traced is None and len(calls) == 1
    assert caplog.text.count("traced forward failed (RuntimeError: graph broke)") == 1
    for g, a, w in zip(got, again, want, strict=True):
        np.testing.assert_allclose(g["embedding"], w["embedding"], atol=PARITY_ATOL, rtol=0)
        np.testing.assert_allclose(a["embedding"], w["embedding"], atol=PARITY_ATOL, rtol=0)


def test_out_of_memory_in_the_trace_is_not_a_fallback(tiny_embed_dir: Path) -> None:
    traced, _ = _pair(tiny_embed_dir)
    backend = traced.backend
    assert isinstance(backend, TorchBackend)

    def oom(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        raise MemoryError("out of memory")

    backend.traced = oom
    with pytest.raises(MemoryError):
        _run(traced, _items(tiny_embed_dir, TEXTS[:2]), 0)
    assert backend.traced is oom


def test_bf16_autocast_batches_run_eager_small_ones_traced(tiny_embed_dir: Path) -> None:
    runner = load_runner(tiny_embed_dir, device="cpu", autocast="bf16")
    backend = runner.backend
    assert isinstance(backend, TorchBackend) and backend.traced is not None
    inner = backend.traced
    shapes: list[tuple[int, ...]] = []

    def spy(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        shapes.append(tuple(ids.shape))
        return inner(ids, mask)

    backend.traced = spy
    items = _items(tiny_embed_dir, ["a b", "c d e"])
    backend.forward(backend.prepare(items, 8))  # 16 padded tokens: fp32, traced
    backend.forward(backend.prepare(items, CPU_BF16_MIN_PADDED_TOKENS))  # autocast: eager
    assert shapes == [(2, 8)]


def test_the_setting_turns_the_trace_off(tiny_embed_dir: Path) -> None:
    assert ModelSettings().torch_trace is True
    settings = ModelSettings(model=str(tiny_embed_dir), device="cpu", torch_trace=False)
    model = load_model(settings, EngineStats(keep=1), max_length=None, truncate=True)
    assert isinstance(model.runner.backend, TorchBackend)
    assert model.runner.backend.traced is None
    on = load_model(
        ModelSettings(model=str(tiny_embed_dir), device="cpu"),
        EngineStats(keep=1),
        max_length=None,
        truncate=True,
    )
    assert isinstance(on.runner.backend, TorchBackend) and on.runner.backend.traced is not None
