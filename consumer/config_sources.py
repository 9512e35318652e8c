"""Where each setting of a command came from, so that an error names what was actually wrong.

A setting comes from a flag (``--max-batch-size``), a ``KBATCH_*`` variable or a key of the
``--config`` YAML file (precedence in that order, :func:`consumer.config.load_settings`). Pydantic
reports a bad value by field name only; :func:`origins` says, per field, which of the three gave
it, and :func:`describe_settings_error` prints each problem named by that source:

    --max-batch-size: not an integer (got 'abc')
    KBATCH_MAX_BATCH_SIZE=abc: not an integer
    bad.yaml: max_batch_size: not an integer (got 'abc')

:func:`read_config_file` reads the YAML file first, so that a file that is not YAML, not a
mapping or that names an unknown setting is one line naming the file, line and key
(:class:`ConfigFileError`). :class:`CommaListEnvSource` lets a ``KBATCH_*`` variable of a list
setting be written as its flag is (``KBATCH_BUCKET_EDGES=16,32,64``; JSON still works).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import EnvSettingsSource

__all__ = [
    "CommaListEnvSource",
    "ConfigFileError",
    "Origin",
    "describe_settings_error",
    "origins",
    "read_config_file",
]

ENV_PREFIX = "KBATCH_"


class ConfigFileError(ValueError):
    """The ``--config`` file is not YAML, not a mapping of settings, or names an unknown one;
    the message names the file (and the line or the key)."""


def read_config_file(path: Path, known: Collection[str]) -> dict[str, Any]:
    """The settings in YAML file ``path``: a mapping of ``known`` names (an empty file: none).

    Raises:
        FileNotFoundError: no such file.
        ConfigFileError: unreadable, not YAML, not a mapping, or a key not in ``known``
            (the message suggests the closest known name).
    """
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigFileError(f"{path}: cannot read: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise ConfigFileError(f"{path}: not UTF-8 text ({err.reason})") from None
    except yaml.YAMLError as err:
        raise ConfigFileError(f"{path}: not valid YAML: {_yaml_problem(err)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        kind = _YAML_KINDS.get(type(data).__name__, type(data).__name__)
        raise ConfigFileError(
            f"{path}: a mapping of settings is expected (max_batch_size: 32), not a {kind}"
        )
    for key in data:
        if str(key) not in known:
            raise ConfigFileError(f"{path}: {key}: unknown setting{_suggestion(str(key), known)}")
    return {str(k): v for k, v in data.items()}


_YAML_KINDS = {"int": "number", "float": "number", "str": "string", "bool": "boolean"}


def _yaml_problem(err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{where}{problem}"


def _suggestion(key: str, known: Collection[str]) -> str:
    spelled = key.strip().lower().replace("-", "_")
    if spelled in known:
        return f" (keys are spelled with underscores: {spelled})"
    close = difflib.get_close_matches(spelled, sorted(known), n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


@dataclass(frozen=True, slots=True)
class Origin:
    """Where one setting's value came from.

    Attributes:
        kind: ``flag``, ``env`` (a ``KBATCH_*`` variable) or ``file`` (the ``--config`` file).
        name: the flag (``--max-batch-size``), the variable (``KBATCH_MAX_BATCH_SIZE``) or the
            file's key (``max_batch_size``).
        raw: the variable's text as set (``env`` only; None for a secret).
        file: the config file (``file`` only).
    """

    kind: Literal["flag", "env", "file"]
    name: str
    raw: str | None = None
    file: Path | None = None

    def describe(self, message: str, value: Any) -> str:
        """One line: this source, then ``message`` (about ``value``, the input pydantic saw)."""
        if self.kind == "env":
            shown = "" if self.raw is None else f"={self.raw}"
            return f"{self.name}{shown}: {message}"
        got = "" if value is _HIDDEN else f" (got {value!r})"
        if self.kind == "file":
            return f"{self.file}: {self.name}: {message}{got}"
        return f"{self.name}: {message}{got}"


_HIDDEN: Any = object()


def flag_of(name: str) -> str:
    """``max_batch_size`` → ``--max-batch-size``."""
    return "--" + name.replace("_", "-")


def origins(
    fields: Collection[str],
    flags: Mapping[str, Any],
    file_settings: Mapping[str, Any],
    config_file: Path | None,
    secrets: Collection[str] = (),
    environ: Mapping[str, str] = os.environ,
    env_names: Callable[[str], list[str]] | None = None,
) -> dict[str, Origin]:
    """Field name → the source its value came from (flag > environment > file); fields given
    by none of them are absent. ``flags``: the flags given (None: not given); ``secrets``:
    fields whose variable's value is never shown; ``env_names``: the variables a field is read
    from, first wins (``SettingsBase.env_names``; default ``KBATCH_<FIELD>``)."""
    env = {k.upper(): (k, v) for k, v in environ.items() if k.upper().startswith(ENV_PREFIX)}
    names = env_names or (lambda name: [ENV_PREFIX + name.upper()])
    out: dict[str, Origin] = {}
    for name in fields:
        variable = next((env[v] for v in names(name) if v in env), None)
        if flags.get(name) is not None:
            out[name] = Origin("flag", flag_of(name))
        elif variable is not None:
            raw = None if name in secrets else variable[1]
            out[name] = Origin("env", variable[0], raw=raw)
        elif name in file_settings:
            out[name] = Origin("file", name, file=config_file)
    return out


_SHORT = {
    "int_parsing": "not an integer",
    "int_from_float": "not a whole number",
    "float_parsing": "not a number",
    "bool_parsing": "not true or false",
}
"""Pydantic error type → a shorter message (the others keep pydantic's)."""


def describe_settings_error(
    err: ValidationError, sources: Mapping[str, Origin], secrets: Collection[str] = ()
) -> str:
    """One line per problem, named by the flag, variable or file key that gave the value
    (``sources``, :func:`origins`); a field given by none is named by its flag.

    A message that names its own flag (``--from 'yesterday' is neither …``) or a rule across
    fields (no single field) is printed as it is, without pydantic's ``Value error,`` prefix.
    """
    lines = []
    for problem in err.errors():
        loc = problem["loc"]
        msg = str(problem["msg"]).removeprefix("Value error, ")
        if not loc or msg.startswith("--"):
            lines.append(msg)
            continue
        field = str(loc[0])
        if problem["type"] == "missing":
            lines.append(f"{flag_of(field)} is required")
            continue
        msg = _SHORT.get(problem["type"], msg)
        if len(loc) > 1 and isinstance(loc[1], int):
            msg = f"item {loc[1] + 1}: {msg}"
        value = _HIDDEN if field in secrets else problem.get("input")
        origin = sources.get(field, Origin("flag", flag_of(field)))
        lines.append(origin.describe(msg, value))
    return "\n".join(lines)


class CommaListEnvSource(EnvSettingsSource):
    """``KBATCH_*`` variables, where a list setting may be written as its flag is: ``16,32,64``
    (a JSON list, ``[16, 32, 64]``, still works)."""

    def decode_complex_value(self, field_name: str, field: FieldInfo, value: Any) -> Any:
        if isinstance(value, str) and not value.lstrip().startswith(("[", "{")):
            return [v.strip() for v in value.split(",") if v.strip()]
        try:
            return super().decode_complex_value(field_name, field, value)
        except ValueError:  # not JSON either: validation names the variable and its value
            return value
