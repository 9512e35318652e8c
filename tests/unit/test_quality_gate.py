"""The quality gate: the comparison figures, the thresholds, and a lossy backend refused at
start-up unless --allow-lossy (consumer/model/quality.py, consumer/model/loader.py)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from consumer.batching.stats import NullStats
from consumer.batching.types import InferenceItem, TokenizedItem
from consumer.config import ModelSettings
from consumer.model import loader
from consumer.model.batch_runner import ModelRunner
from consumer.model.errors import LossyBackendError
from consumer.model.protocol import FakeBackend
from consumer.model.quality import (
    PROBE_TEXTS,
    QualityReport,
    check_gate,
    compare_results,
    probe_gate,
)
from consumer.model.tokenize import WordCountTokenizer


class PerturbedBackend(FakeBackend):
    """FakeBackend's answers with ``by`` added to every component but the first, renormalised."""

    def __init__(self, by: float) -> None:
        super().__init__("embed", max_length=64)
        self.by = by

    def forward(self, prepared: object) -> list[dict[str, Any]]:
        out = super().forward(prepared)
        for r in out:
            v = [x + (self.by if i else 0.0) for i, x in enumerate(r["embedding"])]
            norm = math.sqrt(sum(x * x for x in v))
            r["embedding"] = [x / norm for x in v]
        return out


def _emb(*v: float) -> dict[str, Any]:
    return {"embedding": list(v), "dim": len(v)}


def _cls(label: str, **scores: float) -> dict[str, Any]:
    return {"label": label, "score": scores[label], "scores": scores}


def test_compare_embed_cosines() -> None:
    r = compare_results([_emb(1, 0), _emb(0, 1)], [_emb(1, 0), _emb(1, 1)])
    assert r.n == 2
    assert r.min_cosine == pytest.approx(1 / math.sqrt(2))
    assert r.mean_cosine == pytest.approx((1 + 1 / math.sqrt(2)) / 2)
    assert r.label_agreement is None


def test_compare_classify_agreement_and_delta() -> None:
    ref = [_cls("pos", neg=0.2, pos=0.8), _cls("neg", neg=0.6, pos=0.4)]
    cand = [_cls("pos", neg=0.25, pos=0.75), _cls("pos", neg=0.45, pos=0.55)]
    r = compare_results(ref, cand)
    assert r.label_agreement == 0.5
    assert r.max_abs_delta_score == pytest.approx(0.15)


def test_compare_counts_a_failed_text_as_cosine_zero() -> None:
    assert compare_results([_emb(1, 0)], [None]).min_cosine == 0.0
    with pytest.raises(ValueError):
        compare_results([_emb(1, 0)], [])


@pytest.mark.parametrize(
    ("cosine", "reduced", "refused"),
    [(0.9995, False, False), (0.998, False, True), (0.995, True, False), (0.98, True, True)],
)
def test_thresholds(cosine: float, reduced: bool, refused: bool) -> None:
    report = QualityReport(n=16, min_cosine=cosine, mean_cosine=cosine)
    if refused:
        with pytest.raises(LossyBackendError, match="--allow-lossy"):
            check_gate(report, what="x", reduced_precision=reduced, allow_lossy=False)
        check_gate(report, what="x", reduced_precision=reduced, allow_lossy=True)  # warns only
    else:
        check_gate(report, what="x", reduced_precision=reduced, allow_lossy=False)


def test_a_classifier_that_flips_a_label_is_refused() -> None:
    report = QualityReport(
        n=4, min_cosine=0.9999, mean_cosine=0.9999, label_agreement=0.75, max_abs_delta_score=0.01
    )
    with pytest.raises(LossyBackendError, match="label agreement"):
        check_gate(report, what="x", reduced_precision=True, allow_lossy=False)


def _runner(backend: FakeBackend) -> ModelRunner:
    return ModelRunner(backend, stats=NullStats())


def test_probe_gate_refuses_a_perturbed_backend_and_passes_an_exact_one() -> None:
    tok = WordCountTokenizer(64)
    reference = _runner(FakeBackend("embed", max_length=64))
    lossy = _runner(PerturbedBackend(by=0.5))
    with pytest.raises(LossyBackendError, match="min cosine"):
        probe_gate(lossy, reference, tok, what="perturbed", reduced_precision=True,
                   allow_lossy=False)  # fmt: skip
    report = probe_gate(lossy, reference, tok, what="perturbed", reduced_precision=True,
                        allow_lossy=True)  # fmt: skip
    assert report.n == len(PROBE_TEXTS) and report.min_cosine < 0.99
    exact = probe_gate(_runner(PerturbedBackend(by=0.0)), reference, tok, what="exact",
                       reduced_precision=False, allow_lossy=False)  # fmt: skip
    assert exact.min_cosine == pytest.approx(1.0)


def test_probe_batches_mix_lengths() -> None:
    backend = FakeBackend("embed", max_length=64)
    tok = WordCountTokenizer(64)
    probe_gate(_runner(backend), _runner(FakeBackend("embed", max_length=64)), tok,
               what="x", reduced_precision=False, allow_lossy=False)  # fmt: skip
    assert len(backend.calls) == 2  # 16 probe texts, 8 per batch
    first = tok.tokenize([InferenceItem(i, t) for i, t in enumerate(PROBE_TEXTS[:8])])
    lengths = {t.n_tokens for t in first if isinstance(t, TokenizedItem)}
    assert backend.calls[0] == (8, max(lengths))
    assert len(lengths) > 3  # rows of many lengths padded to the longest


def test_load_model_refuses_a_lossy_backend_at_start_up(
    tiny_embed_dir: Path, onnx_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # --backend onnx on the tiny model, with the ONNX network's answers perturbed: serve and
    # backfill (both call load_model) refuse it unless --allow-lossy.
    real = loader.load_runner

    def perturbed(model_dir: Path, **kw: Any) -> ModelRunner:
        runner = real(model_dir, **{**kw, "backend": "torch"})
        if kw.get("backend") == "onnx":
            base = runner.backend
            forward = base.forward

            def noisy(prepared: object) -> list[dict[str, Any]]:
                out = forward(prepared)
                for r in out:
                    r["embedding"] = [-x if i % 3 == 0 else x for i, x in enumerate(r["embedding"])]
                return out

            base.forward = noisy  # type: ignore[method-assign]
        return runner

    monkeypatch.setattr(loader, "load_runner", perturbed)
    settings = ModelSettings(model=str(tiny_embed_dir), backend="onnx", torch_threads=1)
    with pytest.raises(LossyBackendError, match="--backend onnx"):
        loader.load_model(settings, NullStats(), max_length=None, truncate=True)
    allowed = settings.model_copy(update={"allow_lossy": True})
    loaded = loader.load_model(allowed, NullStats(), max_length=None, truncate=True)
    assert loaded.device == "cpu"


@pytest.mark.parametrize("command", ["serve", "backfill"])
def test_the_cli_exits_1_with_the_gate_s_message(
    command: str, tiny_embed_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from consumer.backfill import app as backfill_app
    from consumer.cli import cli
    from consumer.serve import app

    async def refused(*_a: object, **_k: object) -> int:
        raise LossyBackendError("--backend onnx --quantize int8 answers too far (min cosine 0.97)")

    monkeypatch.setattr(app, "serve", refused)
    monkeypatch.setattr(backfill_app, "run_backfill", refused)
    args = [command, "--model", str(tiny_embed_dir), "--backend", "onnx", "--quantize", "int8"]
    if command == "backfill":
        args += ["--source-topic", "s", "--output-topic", "o"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1, result.output
    assert "min cosine 0.97" in result.output
