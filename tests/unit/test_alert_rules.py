"""The alerting rules: valid (``promtool check rules``), behaving as their unit tests say
(``promtool test rules``), built on exported metrics, loaded by compose, shown on the dashboard.

promtool comes from Debian's ``prometheus`` package (``make tools`` installs it, as ``make
test`` does). Without it these tests skip, except under CI (``CI`` set), where they fail.
"""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

import yaml

from tests.conftest import require_tool
from tests.unit.test_deploy_manifests import ROOT, _compose, _metric_names

RULES = ROOT / "deploy" / "prometheus" / "kbatch.rules.yml"
RULES_TEST = ROOT / "deploy" / "prometheus" / "kbatch.rules.test.yml"
EXPECTED_ALERTS = {
    "KbatchQueueWaitP99High",
    "KbatchBatchSizeStuckAtOne",
    "KbatchModelUtilisationLow",
    "KbatchConsumerLagGrowing",
    "KbatchCommitStalled",
    "KbatchDeadLettersRising",
    "KbatchDeadLetterRefused",
    "KbatchEngineUnhealthy",
}
EXPECTED_RECORDS = {"kbatch:lag_seconds"}  # what the KEDA ScaledObject queries


def _promtool() -> str:
    return require_tool("promtool", "prometheus")


def _all_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def _rules() -> list[dict[str, Any]]:
    """The alerting rules."""
    return [rule for rule in _all_rules() if "alert" in rule]


def _metrics_in(expr: str) -> set[str]:
    return set(re.findall(r"\b(kbatch_[a-z_]+)\b", expr))


def test_promtool_checks_the_rules() -> None:
    out = subprocess.run(
        [_promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(EXPECTED_ALERTS) + len(EXPECTED_RECORDS)} rules found" in out.stdout


def test_promtool_unit_tests_pass() -> None:
    """Each alert fires on its scenario, with its labels and annotations, and not on the
    near misses beside it; each recording rule gives its scenario's values
    (kbatch.rules.test.yml)."""
    out = subprocess.run(
        [_promtool(), "test", "rules", RULES_TEST.name],
        capture_output=True,
        text=True,
        check=False,
        cwd=RULES_TEST.parent,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    tested = set(re.findall(r"alertname: (\w+)", RULES_TEST.read_text()))
    assert tested == EXPECTED_ALERTS
    tested = set(re.findall(r"- expr: (\S+)", RULES_TEST.read_text()))
    assert tested == EXPECTED_RECORDS


def test_recording_rules_use_exported_metrics() -> None:
    records = [rule for rule in _all_rules() if "record" in rule]
    assert {r["record"] for r in records} == EXPECTED_RECORDS
    for rule in records:
        used = _metrics_in(rule["expr"])
        assert used and used <= _metric_names(), (rule["record"], used - _metric_names())


def test_every_alert_has_a_runbook_severity_and_exported_metrics() -> None:
    rules = _rules()
    assert {r["alert"] for r in rules} == EXPECTED_ALERTS
    exported = _metric_names()
    for rule in rules:
        assert rule["annotations"]["runbook"].strip(), rule["alert"]
        assert rule["annotations"]["summary"].strip(), rule["alert"]
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}, rule["alert"]
        used = _metrics_in(rule["expr"])
        assert used and used <= exported, (rule["alert"], used - exported)


def test_compose_prometheus_loads_the_rules() -> None:
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    (rule_file,) = prom["rule_files"]
    mounts = _compose()["services"]["prometheus"]["volumes"]
    assert f"./deploy/prometheus/kbatch.rules.yml:{rule_file}:ro" in mounts


def test_the_dashboard_has_a_panel_per_alert_on_the_same_metrics() -> None:
    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/kbatch.json").read_text())
    for rule in _rules():
        panels = [p for p in dashboard["panels"] if rule["alert"] in p["title"]]
        assert panels, f"no panel names {rule['alert']}"
        shown = set().union(*(_metrics_in(t["expr"]) for p in panels for t in p["targets"]))
        assert _metrics_in(rule["expr"]) - {"kbatch_records_consumed_total"} <= shown, rule["alert"]
