"""docker-compose.yml cannot run here (no Docker engine): check it agrees with the CLI instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from consumer.broker.local import KAFKA_VERSION
from consumer.cli.serve import serve_command
from consumer.config import ServeSettings

ROOT = Path(__file__).resolve().parents[2]


def _compose() -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "docker-compose.yml").read_text()))


def _flags(command: list[str]) -> dict[str, str]:
    """``["serve", "--a", "1", "--b", "2"]`` → ``{"--a": "1", "--b": "2"}``."""
    assert command[0] == "serve"
    args = command[1:]
    return dict(zip(args[::2], args[1::2], strict=True))


def test_services_are_the_documented_ones() -> None:
    services = _compose()["services"]
    assert {"kafka", "kafka-init", "kbatch", "prometheus"} <= set(services)
    assert services["kbatch"]["deploy"]["replicas"] >= 2
    assert services["kbatch"]["build"] == "."
    assert (ROOT / "Dockerfile").is_file()


def test_kafka_image_matches_the_local_broker_version() -> None:
    services = _compose()["services"]
    assert services["kafka"]["image"] == f"apache/kafka:{KAFKA_VERSION}"
    assert services["kafka-init"]["image"] == f"apache/kafka:{KAFKA_VERSION}"
    env = services["kafka"]["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "1"
    assert env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "1"
    assert env["KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS"] == "0"


def test_consumer_flags_exist_and_validate() -> None:
    flags = _flags(_compose()["services"]["kbatch"]["command"])
    known = {opt for p in serve_command.params for opt in p.opts}
    assert set(flags) <= known
    settings = ServeSettings(**{k[2:].replace("-", "_"): v for k, v in flags.items()})
    assert settings.metrics_host == "0.0.0.0"


def test_init_creates_the_topics_the_consumer_uses() -> None:
    services = _compose()["services"]
    script = "\n".join(services["kafka-init"]["command"])
    flags = _flags(services["kbatch"]["command"])
    for flag in ("--request-topic", "--reply-topic", "--dlq-topic"):
        assert f"{flags[flag]}:" in script, flag
    defaults = ServeSettings()
    assert flags["--request-topic"] == defaults.request_topic
    assert flags["--reply-topic"] == defaults.reply_topic
    assert flags["--dlq-topic"] == defaults.dlq_topic


def test_prometheus_scrapes_the_metrics_port() -> None:
    flags = _flags(_compose()["services"]["kbatch"]["command"])
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    (job,) = prom["scrape_configs"]
    assert job["dns_sd_configs"][0]["names"] == ["kbatch"]
    assert str(job["dns_sd_configs"][0]["port"]) == flags["--metrics-port"]
    assert flags["--metrics-port"] in _compose()["services"]["kbatch"]["expose"]
