"""Prompts from ``config_sentence_transformers.json`` and the default prompt a server uses
(``--default-prompt-name`` wins over the model's ``default_prompt_name``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from consumer.cli import cli
from consumer.model.prompts import read_prompts, resolve_default_prompt
from tests.fixtures.tiny_models import PROMPTS


def test_the_models_prompts_and_default(tiny_raw_embed_dir: Path) -> None:
    assert read_prompts(tiny_raw_embed_dir) == (PROMPTS, "query")


def test_a_model_without_the_file_has_no_prompts(tiny_embed_dir: Path) -> None:
    assert read_prompts(tiny_embed_dir) == ({}, None)


def test_the_server_flag_wins_over_the_models_default(tiny_raw_embed_dir: Path) -> None:
    assert resolve_default_prompt(tiny_raw_embed_dir, "embed", None)[1] == "query"
    assert resolve_default_prompt(tiny_raw_embed_dir, "embed", "passage")[1] == "passage"


@pytest.mark.parametrize(("task", "name"), [("embed", "nope"), ("classify", "query")])
def test_a_default_prompt_the_model_cannot_use_is_refused(
    tiny_raw_embed_dir: Path, task: str, name: str
) -> None:
    with pytest.raises(ValueError, match="--default-prompt-name"):
        resolve_default_prompt(tiny_raw_embed_dir, task, name)


def test_a_malformed_prompts_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": {"q": "q: "}, "default_prompt_name": "x"})
    )
    with pytest.raises(ValueError, match="default_prompt_name 'x'"):
        read_prompts(tmp_path)


def test_serve_refuses_an_unknown_default_prompt_before_starting(
    tiny_prompt_embed_dir: Path,
) -> None:
    args = ["serve", "--model", str(tiny_prompt_embed_dir), "--default-prompt-name", "nope"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and "is not one of the model's prompts" in result.output


def test_backfill_and_serve_have_the_option_flags() -> None:
    def flags(command: str) -> set[str]:  # --help wraps long names: read the options
        cmd = cli.commands[command]  # type: ignore[attr-defined]
        return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}

    backfill = flags("backfill")
    for flag in ("--dimensions", "--normalize", "--no-normalize", "--prompt-name",
                 "--encoding-format", "--default-prompt-name"):  # fmt: skip
        assert flag in backfill
    assert "--default-prompt-name" in flags("serve")
    assert "--prompt-name" in CliRunner().invoke(cli, ["backfill", "--help"]).output
