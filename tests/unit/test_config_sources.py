"""Each settings problem named by the source that gave the value (consumer/config_sources.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from consumer.config import COMMAND_CONFIG, SettingsBase
from consumer.config_sources import (
    ConfigFileError,
    describe_settings_error,
    origins,
    read_config_file,
)


class _Settings(SettingsBase):
    model_config = COMMAND_CONFIG
    max_batch_size: int = 8
    password: SecretStr | None = None


def _error(**values: object) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        _Settings.model_validate(values)
    return caught.value


@pytest.mark.parametrize(
    ("flags", "environ", "file", "expected"),
    [
        ({"max_batch_size": "x"}, {"KBATCH_MAX_BATCH_SIZE": "y"}, {"max_batch_size": "z"},
         "--max-batch-size: not an integer (got 'x')"),
        ({}, {"KBATCH_MAX_BATCH_SIZE": "x"}, {"max_batch_size": "z"},
         "KBATCH_MAX_BATCH_SIZE=x: not an integer"),
        ({}, {"kbatch_max_batch_size": "x"}, {}, "kbatch_max_batch_size=x: not an integer"),
        ({}, {}, {"max_batch_size": "x"}, "k.yaml: max_batch_size: not an integer (got 'x')"),
    ],
)  # fmt: skip
def test_the_winning_source_is_named(
    flags: dict[str, str], environ: dict[str, str], file: dict[str, str], expected: str
) -> None:
    sources = origins(_Settings.model_fields, flags, file, Path("k.yaml"), environ=environ)
    assert describe_settings_error(_error(max_batch_size="x"), sources) == expected


def test_a_secret_variables_value_is_never_shown() -> None:
    sources = origins(_Settings.model_fields, {}, {}, None, {"password"}, {"KBATCH_PASSWORD": "7"})
    line = describe_settings_error(_error(password=7), sources, {"password"})
    assert line.startswith("KBATCH_PASSWORD: ") and "7" not in line


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("max_batch_sise: 8\n", "max_batch_sise: unknown setting (did you mean max_batch_size?)"),
        ("colour: red\n", "colour: unknown setting"),
        ("a: [\n", "not valid YAML: line 2, column 1: expected the node content"),
        ("7\n", "a mapping of settings is expected (max_batch_size: 32), not a number"),
    ],
)
def test_a_bad_config_file_is_one_line_naming_the_file(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = tmp_path / "k.yaml"
    path.write_text(text)
    with pytest.raises(ConfigFileError) as caught:
        read_config_file(path, _Settings.model_fields)
    assert str(caught.value).startswith(f"{path}: {expected}")


def test_an_empty_config_file_gives_nothing(tmp_path: Path) -> None:
    (tmp_path / "k.yaml").write_text("# nothing yet\n")
    assert read_config_file(tmp_path / "k.yaml", _Settings.model_fields) == {}
