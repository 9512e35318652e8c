"""LocalBroker's version choice, logging configuration and data-compatibility guard (no Java)."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumer.broker.local import (
    KAFKA3_VERSION,
    KAFKA_VERSION,
    BrokerError,
    LocalBroker,
    kafka_major,
)


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KBATCH_CACHE_DIR", str(tmp_path))


def test_default_is_kafka_4_and_3_9_stays_selectable() -> None:
    assert kafka_major(KAFKA_VERSION) == 4
    assert KAFKA3_VERSION.startswith("3.9.")
    assert LocalBroker().kafka_version == KAFKA_VERSION


@pytest.mark.parametrize("bad", ["2.8.1", "4.4", "latest", "5.0.0"])
def test_unsupported_versions_are_refused_with_what_to_use(bad: str) -> None:
    with pytest.raises(BrokerError, match=r"use 4\.x\.y \(default\) or 3\.9\.x"):
        kafka_major(bad)


def test_each_line_gets_its_own_jars_and_logging_config() -> None:
    new, old = LocalBroker(port=9500), LocalBroker(port=9502, kafka_version=KAFKA3_VERSION)
    assert new.libs_dir.parent.name == KAFKA_VERSION
    assert old.libs_dir.parent.name == KAFKA3_VERSION
    new_cmd, old_cmd = new._java("kafka.Kafka"), old._java("kafka.Kafka")
    assert any(a.startswith("-Dlog4j2.configurationFile=") for a in new_cmd)
    assert any(a.startswith("-Dlog4j.configuration=file:") for a in old_cmd)
    new._write_config()
    old._write_config()
    assert "rootLogger.appenderRef.file.ref=file" in (new.home / "log4j2.properties").read_text()
    assert "log4j.rootLogger=WARN, file" in (old.home / "log4j.properties").read_text()
    props = (new.home / "server.properties").read_text()
    assert "auto.create.topics.enable=false" in props


def test_kafka_3_refuses_data_written_by_kafka_4(tmp_path: Path) -> None:
    """A 3.9 broker cannot read a 4.x metadata log: say so before Java fails obscurely."""
    old = LocalBroker(port=9504, kafka_version=KAFKA3_VERSION)
    data = old.home / "data"
    data.mkdir(parents=True)
    (data / "meta.properties").write_text("version=1\n")
    (data / "kbatch-kafka-version").write_text(KAFKA_VERSION)
    with pytest.raises(BrokerError, match="--fresh"):
        old._format(old.home / "server.properties")
    # the other direction (3.9 data, 4.x broker) is an upgrade Kafka performs itself
    (data / "kbatch-kafka-version").write_text(KAFKA3_VERSION)
    LocalBroker(port=9504)._format(old.home / "server.properties")


def test_a_cluster_id_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    """``kafka-storage format -t -x…`` takes such an id for a flag (a CI run failed on one)."""
    import uuid

    from consumer.broker import local

    dash_first = uuid.UUID(bytes=b"\xf8" + bytes(15))  # base64url "-" is 0b111110...
    ids = iter([dash_first, uuid.UUID(int=1)])
    monkeypatch.setattr(local.uuid, "uuid4", lambda: next(ids))
    cluster_id = local.new_cluster_id()
    assert not cluster_id.startswith("-") and len(cluster_id) == 22
