"""The generated reference (docs/reference/cli.md, settings.md, metrics.md) is what
scripts/reference_docs.py draws from the code now, and every flag and setting says what it is.

A flag or setting added, renamed or re-described without ``python scripts/reference_docs.py
--write`` fails :func:`test_the_reference_is_up_to_date`."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import click

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "reference_docs", ROOT / "scripts" / "reference_docs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_reference_is_up_to_date() -> None:
    gen = _generator()
    for path, text in (
        (gen.CLI_DOC, gen.cli_reference()),
        (gen.SETTINGS_DOC, gen.settings_reference()),
        (gen.METRICS_DOC, gen.metrics_reference()),
    ):
        assert path.read_text() == text, (
            f"{path.relative_to(ROOT)} is stale: run `python scripts/reference_docs.py --write`"
        )


def test_every_flag_and_setting_is_described() -> None:
    from consumer.cli import cli

    gen = _generator()
    undocumented = [
        f"{' '.join(words)} {param.opts[0]}"
        for words, command in gen._commands(cli, ("kbatch",))
        for param in command.params
        if isinstance(param, click.Option) and not param.hidden and not (param.help or "").strip()
    ]
    assert not undocumented, f"flags without help text: {undocumented}"
    for _, cls in gen._commands_settings():
        missing = [n for n, f in cls.model_fields.items() if not (f.description or "").strip()]
        assert not missing, f"{cls.__name__}: settings without a description: {missing}"


def test_the_settings_reference_names_every_field_with_its_variable() -> None:
    gen = _generator()
    text = gen.settings_reference()
    for _, cls in gen._commands_settings():
        for name in cls.model_fields:
            assert f"| `{name}` |" in text, name
            for variable in cls.env_names(name):  # KBATCH_BACKFILL_* for backfill's fields
                assert f"`{variable}`" in text, (cls.__name__, name, variable)


def test_a_new_flag_makes_the_reference_stale() -> None:
    """The staleness check can fail: a flag added to a command changes the generated text."""
    from consumer.cli import cli

    gen = _generator()
    before = gen.cli_reference()
    serve = cli.commands["serve"]
    extra = click.Option(["--not-a-real-flag"], help="Added by the test.")
    serve.params.append(extra)
    try:
        after = gen.cli_reference()
        assert after != before and "`--not-a-real-flag`" in after
    finally:
        serve.params.remove(extra)
