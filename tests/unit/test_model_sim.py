"""The simulated accelerator: its spec, its cost model on a fake sleep, its answers."""

from __future__ import annotations

import math

import pytest

from consumer.batching.types import InferenceItem, TokenizedItem
from consumer.config import ModelSettings
from consumer.model.batch_runner import ModelRunner
from consumer.model.loader import load_model, resolve_model
from consumer.model.sim_backend import SimBackend, SimSpec, parse_sim


def item(i: int, ids: list[int]) -> TokenizedItem:
    return TokenizedItem(InferenceItem(i, "x"), ids, len(ids), False)


class FakeSleep:
    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


@pytest.mark.parametrize(
    ("model", "spec"),
    [
        ("sim:0.3,0.05", SimSpec(0.3, 0.05, 384)),
        ("sim:1,2,8", SimSpec(1.0, 2.0, 8)),
        ("sim: 0 , 0.5 ", SimSpec(0.0, 0.5, 384)),
        ("minilm", None),
        ("noop", None),
    ],
)
def test_parse_sim(model: str, spec: SimSpec | None) -> None:
    assert parse_sim(model) == spec


@pytest.mark.parametrize(
    "model", ["sim:", "sim:1", "sim:1,2,3,4", "sim:a,b", "sim:-1,2", "sim:1,2,0"]
)
def test_parse_sim_refuses_malformed_specs(model: str) -> None:
    with pytest.raises(ValueError, match="FIXED_MS,US_PER_TOKEN"):
        parse_sim(model)


def test_forward_sleeps_fixed_plus_per_padded_token() -> None:
    sleep = FakeSleep()
    backend = SimBackend(SimSpec(0.5, 2.0, 16), 128, sleep=sleep)
    items = [item(0, [101, 7, 102]), item(1, [101, 102])]
    out = backend.forward(backend.prepare(items, 10))
    # 0.5 ms + 2 µs × (2 items × 10 padded tokens) = 0.54 ms
    assert sleep.calls == [pytest.approx(0.5e-3 + 2e-6 * 20)]
    assert backend.busy_s == pytest.approx(0.54e-3)
    assert backend.batches == 1
    assert len(out) == 2
    for row in out:
        assert row["dim"] == 16 and len(row["embedding"]) == 16
        assert math.isclose(math.fsum(v * v for v in row["embedding"]), 1.0, rel_tol=1e-9)


def test_answers_depend_on_the_ids_only() -> None:
    backend = SimBackend(SimSpec(0, 0, 32), 64, sleep=FakeSleep())
    alone = backend.forward(backend.prepare([item(0, [101, 5, 102])], 3))[0]
    batched = backend.forward(
        backend.prepare([item(9, [101, 6, 6, 102]), item(1, [101, 5, 102])], 4)
    )
    assert batched[1]["embedding"] == alone["embedding"]
    assert batched[0]["embedding"] != alone["embedding"]


def test_prepare_refuses_an_item_longer_than_padded_len() -> None:
    backend = SimBackend(SimSpec(0, 0), 64, sleep=FakeSleep())
    with pytest.raises(ValueError, match="longer"):
        backend.prepare([item(0, [1, 2, 3])], 2)


def test_classify_is_refused() -> None:
    with pytest.raises(ValueError, match="embed"):
        SimBackend(SimSpec(0, 0), 64, task="classify")


def test_runner_over_sim_reports_the_sleep_as_model_time() -> None:
    backend = SimBackend(SimSpec(5.0, 0.0, 4), 64)  # a real 5 ms sleep
    runner = ModelRunner(backend)
    from consumer.batching.types import Batch

    (first, _) = runner.run(Batch([item(0, [1, 2]), item(1, [3])], 2, 0.0))
    assert first.result is not None and first.result["dim"] == 4
    assert first.infer_ms >= 5.0


def test_loader_pairs_sim_with_minilm_tokenizer() -> None:
    settings = ModelSettings.model_validate({"model": "sim:0.2,0.01,8"})
    path, info = resolve_model(settings)
    assert info.name == "sim:0.2,0.01,8" and (path / "tokenizer.json").is_file()
    model = load_model(settings, _NoStats(), max_length=None, truncate=True)
    assert isinstance(model.runner.backend, SimBackend)
    assert model.profile.dim == 8 and model.runner.max_length == 256
    (tok,) = model.tokenizer.tokenize([InferenceItem(0, "hello world")])
    assert isinstance(tok, TokenizedItem) and tok.input_ids[0] == 101  # [CLS]: MiniLM's vocab


class _NoStats:
    def on_batch(self, *args: object) -> None: ...

    def on_queue_wait(self, *args: object) -> None: ...

    def on_expired(self, *args: object) -> None: ...

    def on_split(self) -> None: ...

    def on_failed(self, *args: object) -> None: ...

    def on_watchdog(self) -> None: ...
