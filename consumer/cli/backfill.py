"""``kbatch backfill``: re-score a topic's history over an offset or time range.

Every :class:`consumer.backfill.config.BackfillSettings` field is a flag; ``--from``/``--to``
are ``range_from``/``range_to``. See ``kbatch backfill --help``.

``kbatch backfill`` with flags and no subcommand runs the backfill in this process, as always;
``submit``/``status``/``cancel`` manage backfill jobs run by ``kbatch serve`` (docs/JOBS.md).
The command is a click group invoked without a subcommand too, so both shapes work.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import click
from rich_click import RichGroup

from consumer.backfill.config import BackfillSettings
from consumer.cli.backfill_jobs import add_job_commands
from consumer.cli.checks import check_startup
from consumer.cli.extras import require_serve_extra
from consumer.cli.options import config_param, settings_from_flags, settings_options

_EXPLICIT = frozenset({"source_topic", "output_topic", "range_from", "range_to"})


def _backfill(config: Path | None, as_json: bool, **flags: Any) -> None:
    if click.get_current_context().invoked_subcommand is not None:
        if config is not None or as_json or any(v is not None for v in flags.values()):
            raise click.UsageError("give the flags after the subcommand")
        return
    settings = settings_from_flags(BackfillSettings, config, flags)
    require_serve_extra()  # before the model layer's imports (a client install has none)
    # Before anything starts. A budget not given is raised to the model's maximum length.
    given = "max_batch_tokens" in settings.model_fields_set
    check_startup(settings, settings.batch_policy(cuda=False) if given else None)
    from consumer.backfill.app import run_backfill
    from consumer.kafka.errors import (
        KafkaUnavailableError,
        RangeSourceError,
        RangeSpecError,
        TransactionError,
    )
    from consumer.model.errors import LossyBackendError
    from consumer.options import OptionError
    from consumer.tracing.provider import TracingUnavailableError

    try:
        code = asyncio.run(run_backfill(settings, json_summary=as_json))
    except (RangeSpecError, OptionError) as err:
        raise click.UsageError(str(err)) from err
    except (
        RangeSourceError,
        FileNotFoundError,
        LossyBackendError,
        TracingUnavailableError,
    ) as err:
        raise click.ClickException(str(err)) from err
    except KafkaUnavailableError as err:  # KafkaSecurityError: a refused login or an ACL
        raise click.ClickException(str(err)) from None
    except TransactionError as err:  # --exactly-once: a rerun resumes from the last commit
        raise click.ClickException(f"{err}; rerun to resume") from err
    sys.exit(code)


_RANGE_PARAMS = [
    click.Option(
        ["--source-topic", "source_topic"],
        default=None,
        help="Topic whose history is scored (env KBATCH_BACKFILL_SOURCE_TOPIC). Required.",
    ),
    click.Option(
        ["--output-topic", "output_topic"],
        default=None,
        help="Topic the scored records go to (env KBATCH_BACKFILL_OUTPUT_TOPIC). Required.",
    ),
    click.Option(
        ["--from", "range_from"],
        default=None,
        help="Start (inclusive): earliest | ISO-8601 time with zone | P:OFFSET,… "
        "[default: earliest] (env KBATCH_BACKFILL_RANGE_FROM)",
    ),
    click.Option(
        ["--to", "range_to"],
        default=None,
        help="End (exclusive), fixed at start: now | ISO-8601 time with zone | P:OFFSET,… "
        "[default: now] (env KBATCH_BACKFILL_RANGE_TO)",
    ),
]
_COMMON_PARAMS = [
    config_param(),
    click.Option(
        ["--json", "as_json"],
        is_flag=True,
        default=False,
        help="Also print the final summary as one JSON object on stdout.",
    ),
]

backfill_command = RichGroup(
    name="backfill",
    callback=_backfill,
    invoke_without_command=True,
    params=[
        *_RANGE_PARAMS,
        *_COMMON_PARAMS,
        *settings_options(BackfillSettings, exclude=_EXPLICIT),
    ],
    help="Score a topic's history over an offset or time range with the batching engine "
    "(waits off), writing contract replies keyed by the source key. Resumable: commits under "
    "its own consumer group (one with live members, a running serve's, is refused). Reads "
    "KBATCH_BACKFILL_* variables, never serve's KBATCH_* (but the connection's: bootstrap, "
    "TLS, SASL). Output values are msgpack, or JSON when the source value was read "
    "as JSON; headers kbatch.source.topic/partition/offset name the source record. Exit 0 "
    "only when every partition reached its end and not every record read was dead-lettered; 3 "
    "when stopped by a signal first; 1 otherwise. "
    "Subcommands submit, status and cancel manage the same backfill as a job run by kbatch "
    "serve (docs/JOBS.md).",
)
add_job_commands(backfill_command, _RANGE_PARAMS, _COMMON_PARAMS[0], _EXPLICIT)
