"""``--help`` in option panels by concern (consumer/cli/help_groups.py)."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from consumer.cli import cli
from consumer.cli.help_groups import GROUP_ORDER, OPTION_GROUP, OTHER, groups_of


def _command(*path: str) -> click.Command:
    command: click.Command = cli
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    return command


def _commands(command: click.Command, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [path]
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            found += _commands(sub, (*path, name))
    return found


@pytest.mark.parametrize("path", _commands(cli)[1:], ids=" ".join)
def test_a_command_with_panels_has_a_group_for_every_option(path: tuple[str, ...]) -> None:
    groups = groups_of(_command(*path))
    if len(groups) > 1:  # one panel (the small commands) or none of them ungrouped
        assert OTHER not in groups, [o.name for o in groups[OTHER]]


def test_serve_help_shows_the_groups_in_order_each_option_in_its_own() -> None:
    text = CliRunner().invoke(cli, ["serve", "--help"], terminal_width=120).output
    shown = [g for g in GROUP_ORDER if f"─ {g} ─" in text]
    assert shown == list(groups_of(_command("serve")))
    assert shown[:2] == ["Kafka", "Topics"]
    panels = {g: text.index(f"─ {g} ─") for g in shown}
    placed = {"--group-id": "Kafka", "--request-topic": "Topics", "--bulk-min-share": "Lanes"}
    for flag, group in placed.items():
        after = [p for p in panels.values() if p > panels[group]]
        end = min(after, default=len(text))
        assert panels[group] < text.index(flag) < end, (flag, group)


def test_the_mapping_names_only_known_groups() -> None:
    assert set(OPTION_GROUP.values()) <= set(GROUP_ORDER)


def test_a_command_s_own_groups_win_over_the_shared_ones() -> None:
    def group(path: tuple[str, ...], name: str) -> str:
        found = groups_of(_command(*path))
        return next(g for g, options in found.items() if name in [o.name for o in options])

    assert group(("serve",), "task") == "Model"
    assert group(("request",), "task") == "Request options"
    assert group(("request",), "timeout_s") == "Delivery"
    assert group(("load",), "seed") == "Load"
    assert group(("bench", "engine"), "seed") == "Benchmark"
    assert group(("serve",), "replicas") == "Process"
    assert group(("serve",), "config") == "Configuration"
    assert group(("backfill", "submit"), "jobs_topic") == "Backfill jobs"
