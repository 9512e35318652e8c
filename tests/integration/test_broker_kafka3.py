"""The previous Kafka line (3.9.x) still works: round trip, consumer group, transaction.

The suite's broker runs the default Kafka 4.x; this module starts a 3.9.x broker of its own
through the same :class:`LocalBroker` code (``kbatch broker start --kafka-version``), on a free
port, and stops and removes it afterwards. The tests themselves are the ones
``test_broker.py`` runs against the 4.x broker; the module-scoped ``kafka_bootstrap`` here
points them at the 3.9 broker.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from consumer.broker.local import KAFKA3_VERSION, LocalBroker
from tests.integration.harness import free_port_pair
from tests.integration.test_broker import (
    test_produce_and_consume_round_trip as test_kafka3_round_trip,
)
from tests.integration.test_broker import (
    test_transactional_round_trip as test_kafka3_group_and_transaction,
)

__all__ = ["test_kafka3_group_and_transaction", "test_kafka3_round_trip"]


@pytest.fixture(scope="module")
def kafka_bootstrap() -> Iterator[str]:
    """A fresh Kafka 3.9.x broker on a free port pair, stopped and wiped after the module."""
    broker = LocalBroker(port=free_port_pair(), kafka_version=KAFKA3_VERSION)
    try:
        bootstrap = broker.start(fresh=True)
        yield bootstrap
    finally:
        broker.stop()
        shutil.rmtree(broker.home, ignore_errors=True)


def test_broker_runs_kafka3(kafka_bootstrap: str) -> None:
    """The broker really is 3.9.x: its log names the version it started as."""
    port = int(kafka_bootstrap.rsplit(":", 1)[1])
    log = LocalBroker(port=port, kafka_version=KAFKA3_VERSION).log_file.read_text()
    assert f"Kafka version: {KAFKA3_VERSION}" in log
