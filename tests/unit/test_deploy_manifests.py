"""docker-compose.yml cannot run here (no Docker engine): check it agrees with the CLI instead."""

from __future__ import annotations

import json
import re
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
    assert {"kafka", "kafka-init", "kbatch", "prometheus", "grafana"} <= set(services)
    assert services["kbatch"]["deploy"]["replicas"] >= 2
    assert services["kbatch"]["build"] == "."
    assert (ROOT / "Dockerfile").is_file()


def test_jaeger_receives_the_consumers_traces_over_otlp_http() -> None:
    services = _compose()["services"]
    assert "4318:4318" in services["jaeger"]["ports"]
    env = services["kbatch"]["environment"]
    assert ServeSettings(tracing=env["KBATCH_TRACING"]).tracing
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4318"
    # the image can trace: it installs the otel extra (tests/unit/test_dockerfile.py)
    assert "e['otel']" in (ROOT / "Dockerfile").read_text()


def test_kafka_image_matches_the_local_broker_version() -> None:
    services = _compose()["services"]
    assert services["kafka"]["image"] == f"apache/kafka:{KAFKA_VERSION}"
    assert services["kafka-init"]["image"] == f"apache/kafka:{KAFKA_VERSION}"
    env = services["kafka"]["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "1"
    assert env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "1"
    assert env["KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS"] == "0"
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"  # like `kbatch broker`


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


def _metric_names() -> set[str]:
    """Every sample name the service exports (histograms add _bucket/_sum/_count)."""
    from consumer.serve.metrics import Metrics

    names: set[str] = set()
    for family in Metrics().registry.collect():
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
        if family.type == "histogram":
            names.update(f"{family.name}{s}" for s in ("_bucket", "_sum", "_count"))
        if family.type == "counter":
            names.add(f"{family.name}_total")
    return names


def _promql_metrics(expr: str) -> set[str]:
    return set(re.findall(r"\b(kbatch_[a-z_]+)\b", expr))


def test_grafana_dashboard_uses_only_exported_metrics() -> None:
    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/kbatch.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = set().union(*(_promql_metrics(e) for e in exprs))
    assert used, "the dashboard queries no kbatch metric"
    assert used <= _metric_names()
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in (
        "batch size",
        "padding efficiency",
        "queue wait",
        "inference",
        "end-to-end",
        "lag",
        "paused",
    ):
        assert topic in titles, topic


def test_grafana_is_provisioned_in_compose() -> None:
    grafana = _compose()["services"]["grafana"]
    mounts = " ".join(grafana["volumes"])
    assert "./deploy/grafana/provisioning:/etc/grafana/provisioning" in mounts
    assert "./deploy/grafana/dashboards:/var/lib/grafana/dashboards" in mounts
    provider = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/dashboards/kbatch.yml").read_text()
    )
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


def _k8s(name: str) -> dict[str, Any]:
    (doc,) = list(yaml.safe_load_all((ROOT / "deploy/k8s" / name).read_text()))
    return dict(doc)


def test_k8s_deployment_agrees_with_the_cli() -> None:
    deployment = _k8s("deployment.yaml")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    flags = _flags(container["args"])
    known = {opt for p in serve_command.params for opt in p.opts}
    assert set(flags) <= known
    settings = ServeSettings(**{k[2:].replace("-", "_"): v for k, v in flags.items()})
    env_names = {e["name"] for e in container["env"]}
    assert env_names <= {f"KBATCH_{f.upper()}" for f in ServeSettings.model_fields}
    port = container["ports"][0]["containerPort"]
    assert port == settings.metrics_port
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > settings.drain_timeout_s


THREAD_SETTINGS = ("--torch-threads", "--threads", "KBATCH_TORCH_THREADS", "OMP_NUM_THREADS")


def test_manifests_set_a_cpu_limit_and_leave_threads_to_the_budget() -> None:
    """The CPU limit is the budget kbatch reads (docs/CPU.md): a hard-coded thread count would
    go stale when the limit changes."""
    (container,) = _k8s("deployment.yaml")["spec"]["template"]["spec"]["containers"]
    resources = container["resources"]
    assert resources["limits"]["cpu"] == resources["requests"]["cpu"]
    named = set(container["args"]) | {e["name"] for e in container["env"]}
    assert named.isdisjoint(THREAD_SETTINGS)
    service = _compose()["services"]["kbatch"]
    assert float(service["deploy"]["resources"]["limits"]["cpus"]) >= 1
    named = set(service["command"]) | set(service.get("environment", {}))
    assert named.isdisjoint(THREAD_SETTINGS)


def test_keda_scales_on_the_groups_lag_in_seconds_and_the_models_busy_ratio() -> None:
    """docs/CLUSTER.md §KEDA: the backlog in seconds (not records, whose meaning depends on the
    model and the hardware) with metricType Value, so replicas = current x seconds / target;
    the busy ratio keeps the replicas a steady load needs."""
    scaled = _k8s("keda-scaledobject.yaml")
    deployment = _k8s("deployment.yaml")
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    lag, busy = scaled["spec"]["triggers"]
    assert lag["type"] == busy["type"] == "prometheus"
    assert lag["metricType"] == "Value"
    rules = yaml.safe_load((ROOT / "deploy/prometheus/kbatch.rules.yml").read_text())["groups"]
    records = {r["record"] for g in rules for r in g["rules"] if "record" in r}
    assert lag["metadata"]["query"].split("{")[0] in records
    assert float(lag["metadata"]["activationThreshold"]) > 0  # no 0<->1 flapping
    assert 0 < float(lag["metadata"]["threshold"]) < 86_400  # below the stalled cap
    assert busy["metricType"] == "AverageValue"
    assert "kbatch_model_busy_ratio" in busy["metadata"]["query"]
    assert 0 < float(busy["metadata"]["threshold"]) < 1
    assert "lagThreshold" not in json.dumps(scaled)  # records per replica: not a fixed count
    assert scaled["spec"]["cooldownPeriod"] >= 120  # longer than a pod's model load
    # equal shares at 1, 2, 3, 4 and 6 replicas up to the maximum
    assert scaled["spec"]["maxReplicaCount"] % 12 == 0


def test_bad_flag_values_are_reported_by_flag_name() -> None:
    from click.testing import CliRunner

    from consumer.cli import cli

    result = CliRunner().invoke(cli, ["serve", "--max-wait-ms", "-1", "--max-batch-size", "0"])
    assert result.exit_code == 2
    assert "--max-wait-ms: Input should be greater than or equal to 0 (got -1.0)" in result.output
    assert "--max-batch-size:" in result.output
    assert "errors.pydantic.dev" not in result.output
