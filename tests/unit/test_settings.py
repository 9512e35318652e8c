"""Settings groups are defined once and composed into the commands (consumer/config.py)."""

from __future__ import annotations

import os
from collections import Counter

import click
import pytest
from pydantic import BaseModel, ValidationError
from pydantic_settings import BaseSettings

from consumer.backfill.config import CUDA_MAX_BATCH_TOKENS, BackfillSettings
from consumer.batching.config import BatchPolicyConfig
from consumer.cli.backfill import backfill_command
from consumer.cli.serve import serve_command
from consumer.config import (
    JobsSettings,
    ModelSettings,
    RunSettings,
    ServeSettings,
    SettingsBase,
    project,
)
from consumer.jobs.settings import SubmitSettings
from consumer.kafka.config import (
    ConsumerGroupSettings,
    KafkaClientSettings,
    PollSettings,
    SinkSettings,
)
from consumer.kafka.flow import FlowConfig
from consumer.tracing.settings import TracingSettings

COMMANDS: dict[str, tuple[type[SettingsBase], click.Command]] = {
    "serve": (ServeSettings, serve_command),
    "backfill": (BackfillSettings, backfill_command),
}
GROUPS: list[type[BaseModel]] = [
    ModelSettings,
    RunSettings,
    KafkaClientSettings,
    ConsumerGroupSettings,
    PollSettings,
    SinkSettings,
    BatchPolicyConfig,
    FlowConfig,
    JobsSettings,
    TracingSettings,
]
# The flags ``kbatch backfill`` spells differently from its field names.
RENAMED = {"range_from": "--from", "range_to": "--to"}

BACKFILL = {"source_topic": "in", "output_topic": "out"}
# Secrets: KBATCH_* or the YAML file only, never a flag.
SECRETS = {"sasl_password"}


def _flags(command: click.Command) -> dict[str, str]:
    """Parameter name → its first long flag."""
    return {
        p.name: next(o for o in p.opts if o.startswith("--"))
        for p in command.params
        if isinstance(p, click.Option) and p.name
    }


def _exposing(group: type[BaseModel]) -> list[str]:
    return [name for name, (cls, _) in COMMANDS.items() if issubclass(cls, group)]


def test_every_group_is_exposed_by_some_command() -> None:
    assert all(_exposing(group) for group in GROUPS)


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g.__name__)
def test_every_field_of_a_group_is_a_flag_of_every_command_that_exposes_it(
    group: type[BaseModel],
) -> None:
    for command in _exposing(group):
        flags = _flags(COMMANDS[command][1])
        for name in group.model_fields:
            if name in SECRETS:
                assert name not in flags, (command, name)  # argv is readable by local users
                continue
            expected = RENAMED.get(name, "--" + name.replace("_", "-"))
            assert flags.get(name) == expected, (command, name)


def _settings_classes() -> set[type[BaseModel]]:
    """Every class in the commands' MROs that can define settings fields."""
    return {
        cls
        for command, _ in COMMANDS.values()
        for cls in command.__mro__
        if issubclass(cls, BaseModel) and cls not in (BaseModel, BaseSettings)
    }


def test_a_settings_field_is_defined_in_exactly_one_class() -> None:
    owners: Counter[str] = Counter()
    for cls in _settings_classes():
        own = vars(cls).get("__annotations__", {})
        owners.update(name for name in own if name in cls.model_fields)
    assert {name: n for name, n in owners.items() if n != 1} == {}
    assert set(owners) == set(ServeSettings.model_fields) | set(BackfillSettings.model_fields)


def test_the_groups_are_the_classes_that_define_fields() -> None:
    defining = {
        cls
        for cls in _settings_classes()
        if any(name in cls.model_fields for name in vars(cls).get("__annotations__", {}))
    }
    assert defining == {*GROUPS, ServeSettings, BackfillSettings}


def test_backfill_overrides_only_defaults() -> None:
    serve = ServeSettings()
    backfill = BackfillSettings(**BACKFILL)
    assert (serve.max_wait_ms, backfill.max_wait_ms) == (10.0, 0.0)
    assert (serve.adaptive_wait, backfill.adaptive_wait) == (True, False)
    assert (serve.poll_timeout_ms, backfill.poll_timeout_ms) == (50, 200)
    assert BackfillSettings.default_of("max_wait_ms") == 0.0
    assert ServeSettings.default_of("max_wait_ms") == 10.0
    # an explicit value still wins over the command's default
    assert BackfillSettings(**BACKFILL, max_wait_ms=5.0).max_wait_ms == 5.0


def test_backfill_help_shows_its_own_defaults() -> None:
    help_of = {p.name: p.help or "" for p in backfill_command.params if isinstance(p, click.Option)}
    assert "[default: 0.0]" in help_of["max_wait_ms"]
    assert "[default: 200]" in help_of["poll_timeout_ms"]
    assert "(env KBATCH_BACKFILL_BATCH_OVERHEAD_TOKENS)" in help_of["batch_overhead_tokens"]
    assert "(env KBATCH_BACKFILL_BOOTSTRAP, else KBATCH_BOOTSTRAP)" in help_of["bootstrap"]
    assert "(env KBATCH_BACKFILL_GROUP_ID)" in help_of["group_id"]


def test_backfill_token_budget_is_by_device_unless_given() -> None:
    backfill = BackfillSettings(**BACKFILL)
    assert backfill.batch_policy(cuda=False).max_batch_tokens == 2048
    assert backfill.batch_policy(cuda=True).max_batch_tokens == CUDA_MAX_BATCH_TOKENS
    given = BackfillSettings(**BACKFILL, max_batch_tokens=4096, batch_overhead_tokens=0)
    assert given.batch_policy(cuda=True).max_batch_tokens == 4096
    assert given.batch_policy(cuda=False).batch_overhead_tokens == 0


@pytest.mark.parametrize("cls", [ServeSettings, BackfillSettings], ids=lambda c: c.__name__)
def test_both_commands_cap_the_token_budget(cls: type[SettingsBase]) -> None:
    extra = BACKFILL if cls is BackfillSettings else {}
    with pytest.raises(ValidationError, match="max_batch_tokens"):
        cls(**extra, max_batch_tokens=(1 << 22) + 1)


@pytest.mark.parametrize("cls", [ServeSettings, BackfillSettings], ids=lambda c: c.__name__)
def test_a_group_rule_is_checked_by_every_command(cls: type[SettingsBase]) -> None:
    extra = BACKFILL if cls is BackfillSettings else {}
    with pytest.raises(ValidationError, match=r"preferred_batch_sizes \(128,\).*=64"):
        cls(**extra, preferred_batch_sizes=[128])


def test_cross_field_errors_print_both_values() -> None:
    with pytest.raises(
        ValidationError, match=r"heartbeat_interval_ms=20000 .* session_timeout_ms=30000"
    ):
        ServeSettings(heartbeat_interval_ms=20_000)


def test_flow_limits_are_validated_once_by_their_group() -> None:
    with pytest.raises(ValidationError, match="max_total_records"):
        ServeSettings(max_total_records=0)
    assert ServeSettings(resume_fraction=0.0).resume_fraction == 0.0
    assert project(FlowConfig, ServeSettings(max_partition_records=3)) == FlowConfig(
        max_partition_records=3
    )


def test_serve_needs_a_group_and_a_dead_letter_topic() -> None:
    settings = ServeSettings()
    assert (settings.effective_group_id, settings.dead_letter_topic) == (
        "kbatch",
        "kbatch.requests.dlq",
    )
    with pytest.raises(ValidationError, match="group_id=None"):
        ServeSettings(group_id=None)


def test_project_cuts_out_one_group() -> None:
    settings = ServeSettings(bootstrap="b:1", send_timeout_ms=250, security_protocol="SSL")
    assert project(SinkSettings, settings) == SinkSettings(send_timeout_ms=250)
    client = project(KafkaClientSettings, settings)
    assert (client.bootstrap, client.security_protocol) == ("b:1", "SSL")
    assert type(client) is KafkaClientSettings


def test_environment_names_stay_flat(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KBATCH_BATCH_OVERHEAD_TOKENS", "7")
    monkeypatch.setenv("KBATCH_SESSION_TIMEOUT_MS", "60000")
    monkeypatch.setenv("KBATCH_BOOTSTRAP", "h:9")
    monkeypatch.setenv("KBATCH_BACKFILL_BATCH_OVERHEAD_TOKENS", "9")
    assert BackfillSettings(**BACKFILL).batch_overhead_tokens == 9
    serve = ServeSettings()
    assert (serve.batch_overhead_tokens, serve.session_timeout_ms, serve.bootstrap) == (
        7,
        60_000,
        "h:9",
    )


def test_serve_variables_do_not_steer_a_backfill(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a shell or pod exports for serve leaves a backfill's group, dead letters and
    batching alone; only the connection settings (one cluster's) are shared."""
    serve_env = {
        "KBATCH_GROUP_ID": "kbatch",
        "KBATCH_DLQ_TOPIC": "kbatch.requests.dlq",
        "KBATCH_MAX_BATCH_SIZE": "7",
        "KBATCH_BOOTSTRAP": "broker:9093",
        "KBATCH_SECURITY_PROTOCOL": "SSL",
    }
    for name, value in serve_env.items():
        monkeypatch.setenv(name, value)
    backfill = BackfillSettings(**BACKFILL)
    assert backfill.effective_group_id.startswith("kbatch-backfill.in.out.")
    assert backfill.dead_letter_topic == "in.dlq"
    assert backfill.max_batch_size == BackfillSettings.default_of("max_batch_size")
    assert (backfill.bootstrap, backfill.security_protocol) == ("broker:9093", "SSL")
    submit = SubmitSettings(**BACKFILL)
    assert (submit.group_id, submit.dlq_topic, submit.bootstrap) == (None, None, "broker:9093")
    assert ServeSettings().group_id == "kbatch"  # serve still reads them


def test_backfill_reads_its_own_prefix_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KBATCH_BOOTSTRAP", "serve:9092")
    monkeypatch.setenv("KBATCH_BACKFILL_BOOTSTRAP", "backfill:9092")
    monkeypatch.setenv("KBATCH_BACKFILL_GROUP_ID", "mine")
    monkeypatch.setenv("KBATCH_BACKFILL_DLQ_TOPIC", "mine.dlq")
    monkeypatch.setenv("KBATCH_JOBS_TOPIC", "jobs.of.serve")
    backfill = BackfillSettings(**BACKFILL)
    assert (backfill.bootstrap, backfill.effective_group_id, backfill.dead_letter_topic) == (
        "backfill:9092",
        "mine",
        "mine.dlq",
    )
    assert SubmitSettings(**BACKFILL).jobs_topic == "jobs.of.serve"  # the serve it submits to
    serve = ServeSettings()
    assert (serve.bootstrap, serve.group_id) == ("serve:9092", "kbatch")


def test_kbatch_main_sets_passive_omp_waits_unless_the_environment_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Spin-waiting OpenMP threads took the cores from the threads a parallel region waited
    # for: 10x slower batches of one under load (BENCHMARKS.md §Engine alone).
    import sys

    from consumer import cli

    monkeypatch.setattr(sys, "argv", ["kbatch", "--help"])
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    with pytest.raises(SystemExit):
        cli.main()
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    with pytest.raises(SystemExit):
        cli.main()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
