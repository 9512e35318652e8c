"""``kbatch serve``: every :class:`consumer.config.ServeSettings` field is a flag."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Any

import click
from rich_click import RichCommand

from consumer.batching.config import BatchPolicyConfig
from consumer.cli.boundary import terminate_on_sigterm
from consumer.cli.checks import check_startup
from consumer.cli.extras import require_serve_extra
from consumer.cli.options import config_param, settings_from_flags, settings_options
from consumer.config import ServeSettings, project


def _serve(config: Path | None, **flags: Any) -> None:
    # Until the drain's handlers are installed (after the model loads); nothing is consumed yet.
    terminate_on_sigterm("during start-up: nothing was consumed")
    settings = settings_from_flags(ServeSettings, config, flags)
    require_serve_extra()  # before the model layer's imports (a client install has none)
    check_startup(settings, project(BatchPolicyConfig, settings))  # before anything starts
    from consumer.serve.app import serve
    from consumer.tracing.provider import TracingUnavailableError, check_tracing

    try:
        if settings.tracing:  # also before a supervisor starts replicas that could not start
            check_tracing()
    except TracingUnavailableError as err:
        raise click.ClickException(str(err)) from None

    if settings.replicas > 1:
        from consumer.serve.replicas import supervise

        sys.exit(asyncio.run(supervise(settings)))
    from consumer.model.errors import LossyBackendError

    try:
        code = asyncio.run(serve(settings))
    except LossyBackendError as err:  # the start-up quality gate (consumer/model/quality.py)
        raise click.ClickException(str(err)) from err
    from consumer.serve.wedge import EXIT_ENGINE_WEDGED

    if code == EXIT_ENGINE_WEDGED:  # the model thread may never return: exiting would join it
        logging.shutdown()
        os._exit(code)
    sys.exit(code)


serve_command = RichCommand(
    name="serve",
    callback=_serve,
    params=[config_param(), *settings_options(ServeSettings)],
    help="Consume requests, run batched inference, publish keyed replies.",
)
