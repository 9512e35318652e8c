"""The Kafka client is chosen once, by setting (``--kafka-client``, ``KBATCH_KAFKA_CLIENT``),
and the seam's factories build that client's adapters; the consumer group protocol needs the
client that speaks it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from consumer.backfill.config import BackfillSettings
from consumer.config import ServeSettings, load_settings
from consumer.kafka.config import ConsumerGroupSettings, KafkaClientSettings, SinkSettings
from consumer.kafka.errors import KafkaUnavailableError
from consumer.kafka.sink import KafkaSink
from consumer.kafka.source import KafkaSource
from consumer.kafka.transactions import TransactionalSink
from consumer.kafka.transport import (
    client_description,
    group_source,
    needs_confluent,
    reply_sink,
    transactional_sink,
)


class _Handler:
    async def on_revoked(self, tps: frozenset[tuple[str, int]]) -> None:
        return

    async def on_assigned(self, tps: frozenset[tuple[str, int]]) -> None:
        return


def test_aiokafka_stays_the_default_client() -> None:
    assert ServeSettings().kafka_client == "aiokafka"
    assert ServeSettings().group_protocol == "classic"


def test_the_client_comes_from_the_environment_for_serve_and_backfill(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KBATCH_KAFKA_CLIENT", "confluent")
    assert load_settings(ServeSettings).kafka_client == "confluent"
    # a connection setting: backfill falls back to serve's variable
    backfill = load_settings(BackfillSettings, source_topic="t", output_topic="o")
    assert backfill.kafka_client == "confluent"


def test_the_consumer_protocol_on_aiokafka_is_refused_with_one_reason() -> None:
    with pytest.raises(
        ValidationError, match="--group-protocol consumer needs --kafka-client confluent"
    ):
        ServeSettings(group_protocol="consumer")
    assert ServeSettings(group_protocol="consumer", kafka_client="confluent").group_protocol == (
        "consumer"
    )


def test_an_unknown_client_is_refused() -> None:
    with pytest.raises(ValidationError, match="aiokafka"):
        ServeSettings(kafka_client="kafka-python")  # type: ignore[arg-type]


async def test_the_factories_build_the_aiokafka_adapters() -> None:
    client = KafkaClientSettings()
    source = group_source(
        client, ConsumerGroupSettings(), _Handler(), group_id="g", topics=("t",), max_poll_records=5
    )
    assert isinstance(source, KafkaSource)
    await source.stop()  # never started: closes the unstarted consumer
    sink = reply_sink(client, SinkSettings(), default_topic="r")
    assert isinstance(sink, KafkaSink)
    await sink.stop()  # never started: closes the unstarted producer
    eos = transactional_sink(client, SinkSettings(), default_topic="r", group_id="g")
    assert isinstance(eos, TransactionalSink)
    with pytest.raises(ValueError, match="needs kafka_client=confluent"):
        group_source(
            client,
            ConsumerGroupSettings(group_protocol="consumer"),
            _Handler(),
            group_id="g",
            topics=("t",),
            max_poll_records=5,
        )


def test_the_start_up_line_names_the_client_and_its_version() -> None:
    assert client_description("aiokafka").startswith("aiokafka 0.")
    assert client_description("confluent").startswith("confluent-kafka 2.16.")
    assert "(librdkafka 2." in client_description("confluent")


def test_without_confluent_kafka_installed_the_choice_is_one_clear_error() -> None:
    missing = pytest.raises(KafkaUnavailableError, match=r"pip install 'kbatch\[serve\]'")
    with missing, needs_confluent():
        raise ModuleNotFoundError("No module named 'confluent_kafka'", name="confluent_kafka")
    with pytest.raises(ModuleNotFoundError), needs_confluent():  # another module: not this one
        raise ModuleNotFoundError("No module named 'x'", name="x")
