"""The one error boundary of the ``kbatch`` console script: every failure is one line.

- a usage error (:class:`click.ClickException`): click's own message and exit code (2 for a
  usage error, 1 otherwise);
- kbatch's own errors (a class defined in ``consumer``, ``producer_tools`` or ``schemas``:
  :class:`~consumer.kafka.errors.KafkaLayerError`, :class:`~consumer.broker.local.BrokerError`,
  ...): ``Error: <message>``, exit 1;
- anything else (a fault of kbatch or of a library under it): ``Error: unexpected <Type>:
  <message> (KBATCH_DEBUG=1 prints the traceback)``, exit 1;
- Ctrl-C (SIGINT) that reaches here: ``interrupted``, exit 130 (128 + SIGINT, as shells do);
- SIGTERM before a command that asked for it (:func:`terminate_on_sigterm`) installs its own
  stop, e.g. during ``serve``'s model load: ``terminated (SIGTERM) <when>``, exit 143.

With ``KBATCH_DEBUG=1`` the last two also print the traceback (the exception propagates).
Commands that handle their own Ctrl-C (``serve``'s drain, ``load``'s partial report) never
let it reach here.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import click
from rich_click import RichGroup

__all__ = [
    "DEBUG_ENV",
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_TERMINATED",
    "BoundaryGroup",
    "Terminated",
    "run_cli",
    "terminate_on_sigterm",
]

DEBUG_ENV = "KBATCH_DEBUG"
"""Environment variable: ``1`` lets an unexpected exception print its traceback."""

EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130
"""Exit status after Ctrl-C: 128 + SIGINT (2), what a shell reports for a process it ended."""
EXIT_TERMINATED = 143
"""Exit status after an early SIGTERM: 128 + SIGTERM (15), as a process ended by it reports."""


class Terminated(BaseException):  # like KeyboardInterrupt: a signal, not a fault
    """SIGTERM arrived while :func:`terminate_on_sigterm`'s handler was installed; ``when``
    says what the command was doing (printed after ``terminated (SIGTERM)``)."""

    def __init__(self, when: str) -> None:
        super().__init__(when)
        self.when = when


def terminate_on_sigterm(when: str) -> None:
    """Until the command installs its own handler (e.g. :func:`consumer.lifecycle.
    stop_on_signals`), SIGTERM raises :class:`Terminated` in the main thread, so that
    ``finally`` blocks and context managers close what is open and the exit is one line
    instead of a silent 143. Call it from the main thread."""

    def raise_terminated(_signum: int, _frame: object) -> None:
        raise Terminated(when)

    signal.signal(signal.SIGTERM, raise_terminated)


_OWN_PACKAGES = frozenset({"consumer", "producer_tools", "schemas"})


def debugging(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether :data:`DEBUG_ENV` asks for tracebacks (``1``, ``true``, ``yes``)."""
    return environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes")


def is_own_error(err: BaseException) -> bool:
    """Whether ``err``'s class is one of kbatch's (its message is written for an operator)."""
    return type(err).__module__.split(".")[0] in _OWN_PACKAGES


def describe(err: BaseException) -> str:
    """The one line printed for ``err`` (without the ``Error:`` prefix)."""
    message = " ".join(str(err).split()) or type(err).__name__
    if is_own_error(err):
        return message
    return f"unexpected {type(err).__name__}: {message}"


def run_cli(command: click.Command, args: Sequence[str] | None = None) -> int:
    """Run ``command`` (the ``kbatch`` group) on ``args`` (default ``sys.argv[1:]``); the
    process exit status. ``SystemExit`` raised by a command passes through unchanged."""
    try:
        result = command.main(args, prog_name="kbatch", standalone_mode=False)
    except click.ClickException as err:
        err.show()
        return err.exit_code
    except click.exceptions.Abort as err:
        if isinstance(err.__context__, KeyboardInterrupt):
            click.echo("interrupted", err=True)
            return EXIT_INTERRUPTED
        click.echo("Aborted!", err=True)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return EXIT_INTERRUPTED
    except Terminated as err:
        click.echo(f"terminated (SIGTERM) {err.when}", err=True)
        return EXIT_TERMINATED
    except Exception as err:
        if debugging():
            raise
        hint = "" if is_own_error(err) else f" ({DEBUG_ENV}=1 prints the traceback)"
        click.echo(f"Error: {describe(err)}{hint}", err=True)
        return EXIT_FAILURE
    return result if isinstance(result, int) else 0


class BoundaryGroup(RichGroup):
    """The ``kbatch`` group: run standalone (the console script, click's test runner), it
    goes through :func:`run_cli`, so every way in prints failures the same way."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        _exit(run_cli(self, args))


def _exit(code: int) -> NoReturn:
    sys.exit(code)
