"""One error tree per layer, each drawn in its module's docstring, each class with ``retriable``;
third-party errors translated at the layer's edge."""

from __future__ import annotations

import types

import pytest
from aiokafka.errors import KafkaConnectionError, RequestTimedOutError

import consumer.batching.errors as batching_errors
import consumer.kafka.errors as kafka_errors
import consumer.model.errors as model_errors
import schemas.errors as schema_errors
from consumer.kafka.aiokafka_errors import map_kafka_errors
from consumer.kafka.client_config import start_client
from consumer.kafka.errors import (
    CommitError,
    DeliveryError,
    KafkaLayerError,
    KafkaUnavailableError,
    RangeSourceError,
    RangeSpecError,
    SinkClosedError,
)
from consumer.model.errors import (
    DeviceOutOfMemoryError,
    FakeOOMError,
    ModelError,
    map_device_errors,
)

LAYERS: list[tuple[types.ModuleType, type[Exception]]] = [
    (kafka_errors, KafkaLayerError),
    (batching_errors, batching_errors.BatchingError),
    (model_errors, ModelError),
    (schema_errors, schema_errors.ContractError),
]


def _classes(module: types.ModuleType) -> list[type[Exception]]:
    return [
        obj
        for name in module.__all__
        if isinstance(obj := getattr(module, name), type) and issubclass(obj, Exception)
    ]


@pytest.mark.parametrize(("module", "base"), LAYERS, ids=lambda x: getattr(x, "__name__", ""))
def test_every_error_of_a_layer_is_in_its_tree(
    module: types.ModuleType, base: type[Exception]
) -> None:
    classes = _classes(module)
    assert classes
    for cls in classes:
        assert issubclass(cls, base), cls
        assert isinstance(cls.retriable, bool), cls  # type: ignore[attr-defined]
        assert cls.__name__ in (module.__doc__ or ""), f"{cls.__name__} is not drawn in the tree"


def test_retriable_says_whether_trying_again_can_help() -> None:
    assert KafkaUnavailableError.retriable and CommitError.retriable
    assert not DeliveryError.retriable and not SinkClosedError.retriable
    assert not RangeSourceError.retriable and not RangeSpecError.retriable
    assert DeviceOutOfMemoryError.retriable and FakeOOMError.retriable
    assert not model_errors.ModelNotFoundError.retriable


def test_errors_keep_the_builtin_bases_callers_catch() -> None:
    assert issubclass(RangeSpecError, ValueError)  # a usage error for the CLI
    assert issubclass(model_errors.ModelNotFoundError, FileNotFoundError)
    assert issubclass(FakeOOMError, MemoryError)


def test_the_old_import_paths_name_the_same_classes() -> None:
    from consumer.kafka import range_source, sink, source

    assert (sink.DeliveryError, sink.SinkClosedError) == (DeliveryError, SinkClosedError)
    assert source.CommitError is CommitError
    assert (range_source.RangeSourceError, range_source.RangeSpecError) == (
        RangeSourceError,
        RangeSpecError,
    )


def test_an_aiokafka_error_is_translated_and_chained() -> None:
    cause = RequestTimedOutError("slow")
    with (
        pytest.raises(CommitError, match=r"^commit of \{\} failed: ") as info,
        map_kafka_errors(CommitError, "commit of {} failed"),
    ):
        raise cause
    assert info.value.__cause__ is cause


def test_other_errors_pass_the_kafka_edge_unchanged() -> None:
    with pytest.raises(RangeSpecError), map_kafka_errors(RangeSourceError, "resolving"):
        raise RangeSpecError("bad bound")
    with pytest.raises(KeyError), map_kafka_errors(RangeSourceError, "resolving"):
        raise KeyError("x")


async def test_a_client_that_cannot_start_is_closed() -> None:
    calls: list[str] = []

    async def start() -> None:
        calls.append("start")
        raise KafkaConnectionError("refused")

    async def close() -> None:
        calls.append("close")

    with pytest.raises(KafkaUnavailableError, match="no broker at b:1: "):
        await start_client(start, close, "no broker at b:1")
    assert calls == ["start", "close"]


async def test_a_client_that_starts_is_not_closed() -> None:
    calls: list[str] = []

    async def start() -> None:
        calls.append("start")

    async def close() -> None:
        calls.append("close")

    await start_client(start, close, "unused")
    assert calls == ["start"]


@pytest.mark.parametrize(
    "cause",
    [MemoryError("host"), RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")],
)
def test_an_out_of_memory_error_is_translated_at_the_model_edge(cause: Exception) -> None:
    with pytest.raises(DeviceOutOfMemoryError) as info, map_device_errors():
        raise cause
    assert info.value.__cause__ is cause
    assert isinstance(info.value, MemoryError)


def test_other_model_errors_keep_their_type_for_the_reply() -> None:
    # the runner's inference_failed message names the exception's type (reply bytes)
    with pytest.raises(ValueError, match="bad shape"), map_device_errors():
        raise ValueError("bad shape")
    fake = FakeOOMError("fake")
    with pytest.raises(FakeOOMError) as info, map_device_errors():
        raise fake
    assert info.value is fake
