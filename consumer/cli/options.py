"""Click options generated from a pydantic settings model: one flag per field.

``max_batch_size`` becomes ``--max-batch-size``; booleans get ``--x/--no-x``; lists are
comma-separated. Every flag defaults to "not given" so the environment and the config file
still apply (see :func:`consumer.config.load_settings`).
"""

from __future__ import annotations

import tempfile
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import annotated_types
import click
from pydantic import BaseModel, SecretStr, ValidationError

from consumer.config import SettingsBase, load_settings
from consumer.config_sources import (
    ConfigFileError,
    describe_settings_error,
    origins,
    read_config_file,
)


class CommaList(click.ParamType):  # type: ignore[type-arg]  # generic only from click 8.2
    """``16,32,64`` → ``[16, 32, 64]`` (ints) or a list of strings."""

    name = "list"

    def __init__(self, item: type) -> None:
        self.item = item

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, list):
            return value
        try:
            return [self.item(v.strip()) for v in str(value).split(",") if v.strip()]
        except ValueError:
            self.fail(
                f"{value!r} is not a comma-separated list of {self.item.__name__}", param, ctx
            )


def _unwrap_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _click_type(annotation: Any) -> Any:
    ann = _unwrap_optional(annotation)
    origin = typing.get_origin(ann)
    if origin is typing.Literal:
        return click.Choice([str(a) for a in typing.get_args(ann)])
    if origin is list or origin is tuple:
        item = typing.get_args(ann)[0]
        return CommaList(item)
    return {
        int: click.INT,
        float: click.FLOAT,
        Path: click.Path(path_type=Path),
    }.get(ann, click.STRING)


def _shown(default: Any) -> str:
    if default is None or default == ():
        return ""
    if isinstance(default, tuple | list):
        default = ",".join(map(str, default))
    return f" [default: {default}]"


def settings_options(
    model: type[SettingsBase], exclude: frozenset[str] = frozenset()
) -> list[click.Option]:
    """One click option per model field (``exclude`` names and secrets, ``SecretStr`` fields,
    are skipped: those come from the environment or the YAML file); the help shows the
    command's text (:attr:`~consumer.config.SettingsBase.help_overrides`, else the field's
    description), default (:meth:`consumer.config.SettingsBase.default_of`) and variables
    (:func:`env_text`)."""
    options: list[click.Option] = []
    for name, field in model.model_fields.items():
        if name in exclude or _unwrap_optional(field.annotation) is SecretStr:
            continue  # a secret is never a flag: argv is readable by every local user
        flag = "--" + name.replace("_", "-")
        shown = _shown(model.default_of(name))
        described = model.help_overrides.get(name, field.description or "")
        help_text = described + shown + f" (env {env_text(model, name)})"
        if _unwrap_optional(field.annotation) is bool:
            options.append(
                click.Option([f"{flag}/--no-{flag[2:]}", name], default=None, help=help_text)
            )
        else:
            options.append(
                click.Option(
                    [flag, name], type=_click_type(field.annotation), default=None, help=help_text
                )
            )
    return options


def env_text(model: type[SettingsBase], name: str) -> str:
    """``KBATCH_BACKFILL_BOOTSTRAP, else KBATCH_BOOTSTRAP``: the variables of field ``name``."""
    return ", else ".join(model.env_names(name))


F = TypeVar("F", bound=Callable[..., Any])
S = TypeVar("S", bound=SettingsBase)

_UNSET: Any = object()


def option(*decls: str, default: Any = None, **attrs: Any) -> Callable[[F], F]:
    """``click.option`` whose help shows the default when there is one (``show_default``)."""
    attrs.setdefault("show_default", default is not None or None)
    return click.option(*decls, default=default, **attrs)


def flag(*decls: str, help: str) -> Callable[[F], F]:
    """An on/off ``click.option`` (``is_flag``): present means True."""
    return click.option(*decls, is_flag=True, help=help)


POSITIVE = click.FloatRange(min=0, min_open=True)


class OutputDir(click.Path):
    """A folder kbatch writes into (plots, logs): made (with its parents) and checked writable
    when the flag is read, so a run that cannot keep its output fails before it starts, in
    one line, instead of with a traceback at its end."""

    def __init__(self) -> None:
        super().__init__(path_type=Path, file_okay=False)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        folder = typing.cast(Path, super().convert(value, param, ctx))  # path_type=Path
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as err:
            self.fail(f"cannot write to {str(folder)!r}: {err.strerror or err}", param, ctx)
        return folder


"""Click type of a float flag that must be above 0 (``--timeout-s``)."""

json_option = flag("--json", "as_json", help="Print one JSON object.")


def seed_option(help: str) -> Callable[[F], F]:
    """``--seed N`` (default 0) of a command that samples texts or arrivals."""
    return option("--seed", type=int, default=0, help=help)


def config_param() -> click.Option:
    """``--config PATH``: the YAML settings file of :func:`settings_from_flags`."""
    return click.Option(
        ["--config", "config"],
        type=click.Path(path_type=Path),
        default=None,
        help="YAML file of settings (flags and environment variables win over it).",
    )


def settings_from_flags(model: type[S], config: Path | None, flags: dict[str, Any]) -> S:
    """:func:`consumer.config.load_settings` of a command's ``--config`` and flags.

    Raises:
        click.UsageError: a value breaks the model's rules (one line per problem, named by the
            flag, ``KBATCH_*`` variable or file key that gave it: :func:`explain`), or the
            ``--config`` file is missing, not YAML or names an unknown setting.
    """
    try:
        return load_settings(model, config, **flags)
    except ValidationError as err:
        raise click.UsageError(explain(model, err, flags, config)) from None
    except (FileNotFoundError, ConfigFileError) as err:
        raise click.UsageError(str(err)) from None


def explain(
    model: type[SettingsBase],
    err: ValidationError,
    flags: dict[str, Any],
    config: Path | None = None,
) -> str:
    """``err`` of :func:`consumer.config.load_settings`, one line per problem, each named by its
    source (:func:`consumer.config_sources.describe_settings_error`)."""
    file_settings = read_config_file(config, model.model_fields) if config is not None else {}
    secrets = {
        name
        for name, field in model.model_fields.items()
        if _unwrap_optional(field.annotation) is SecretStr
    }
    sources = origins(
        model.model_fields, flags, file_settings, config, secrets, env_names=model.env_names
    )
    return describe_settings_error(err, sources, secrets)


def _bounded(field: Any) -> Any:
    """The field's click type, with its ``ge``/``gt``/``le`` bounds for an int or a float."""
    kind = _click_type(field.annotation)
    if kind not in (click.INT, click.FLOAT):
        return kind
    bounds: dict[str, Any] = {}
    for m in field.metadata:
        if isinstance(m, annotated_types.Ge):
            bounds["min"] = m.ge
        elif isinstance(m, annotated_types.Gt):
            bounds.update(min=m.gt, min_open=True)
        elif isinstance(m, annotated_types.Le):
            bounds["max"] = m.le
    if not bounds:
        return kind
    if kind is click.INT:
        if bounds.pop("min_open", False):  # gt=n on an int: at least n + 1
            bounds["min"] += 1
        return click.IntRange(**bounds)
    return click.FloatRange(**bounds)


def group_option(
    group: type[BaseModel],
    name: str,
    *,
    default: Any = _UNSET,
    aliases: tuple[str, ...] = (),
    note: str = "",
) -> Callable[[F], F]:
    """A click option of one field of a settings ``group`` for a command that takes only a
    few of them (``kbatch bench``): the flag, type, bounds and description ``kbatch serve``
    has (``--max-batch-size``, 1 … 4096), with the command's own ``default`` (the group's
    when not given) and, after the description, ``note``. ``aliases``: older spellings that
    still work (``--threads``)."""
    field = group.model_fields[name]
    value = field.default if default is _UNSET else default
    help_text = " ".join(p for p in (field.description or "", note) if p) + _shown(value)
    flag = "--" + name.replace("_", "-")
    return click.option(flag, *aliases, name, type=_bounded(field), default=value, help=help_text)
