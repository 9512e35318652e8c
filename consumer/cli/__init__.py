"""The ``kbatch`` console script: one click group, one sub-group or command per module."""

from __future__ import annotations

import os
import sys

import click

from consumer.cli.backfill import backfill_command
from consumer.cli.bench import bench_group
from consumer.cli.boundary import BoundaryGroup
from consumer.cli.broker import broker_group
from consumer.cli.demo import demo_command
from consumer.cli.help_groups import apply_option_panels
from consumer.cli.load import load_command
from consumer.cli.request import request_command
from consumer.cli.serve import serve_command
from consumer.cli.topics import topics_group

_HELP_CONFIG = {
    # The type (TEXT, INTEGER…) after the help, not in a column of its own: the option column
    # gets the room, so a long flag (--create-topics/--no-create-topics) wraps less at 80
    # columns.
    "options_table_column_types": ["required", "opt_long", "opt_short", "help"],
    "options_table_help_sections": [
        "help",
        "metavar",
        "deprecated",
        "envvar",
        "default",
        "required",
    ],
}


@click.group(
    "kbatch",
    cls=BoundaryGroup,
    context_settings={"help_option_names": ["-h", "--help"], "rich_help_config": _HELP_CONFIG},
)
@click.version_option(package_name="kbatch")
def cli() -> None:
    """Kafka inference consumer: batched model serving over Kafka topics."""


cli.add_command(broker_group)
cli.add_command(bench_group)
cli.add_command(serve_command)
cli.add_command(request_command)
cli.add_command(load_command)
cli.add_command(backfill_command)
cli.add_command(demo_command)
cli.add_command(topics_group)
apply_option_panels(cli)  # --help in panels by concern (consumer/cli/help_groups.py)


THREAD_ENV_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}
"""Set for the process (and the processes it starts) unless the environment already says.

``OMP_WAIT_POLICY=PASSIVE``: torch's OpenMP threads sleep at the end of a parallel region
instead of spin-waiting. With the event loop, the tokenizer thread, Kafka I/O or another
process wanting the same cores, spinning threads take the CPU from the thread a parallel region
is waiting for: measured on the 2-core machine under load (MiniLM, a batch of one, 2 torch
threads), 505-546 ms wall and 180-238 ms CPU per text with the default policy against
42-45 ms wall and 18 ms CPU with PASSIVE (BENCHMARKS.md §Engine alone). libgomp reads it once,
when torch loads, so it is set here, before anything imports torch. ONNX Runtime gets the same
from its session options (``session.intra_op.allow_spinning=0``)."""


GIL_SWITCH_INTERVAL_S = 0.0005
"""The interpreter's switch interval for every kbatch process (CPython's default: 5 ms).

The model thread gives up the GIL around every torch op (≈ 750 C calls in one MiniLM batch of
20) and must take it back to launch the next; while the event loop runs Python (decode, reply
encoding, aiokafka), that wait lasts until the loop blocks or the switch interval forces a
hand-over: up to 5 ms per op. A busy loop then stretches each batch, batches grow, and latency
with them (on the 2-core machine: 2.6× larger batches and ~5× the engine's latency through Kafka;
ONNX Runtime, one C call per batch, had a quarter of torch's latency at the same drain rate).
Measured on the 2-core machine (contended, 40 interleaved runs, MiniLM batch of 8, a thread
running Python 2 ms of every 4): forward p25 47 ms alone, 120 ms at 5 ms, 87 ms at 0.5 ms
(BENCHMARKS.md §Latency under load)."""


def main() -> None:
    """Entry point of the ``kbatch`` console script."""
    for name, value in THREAD_ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    cli()  # BoundaryGroup: every failure one line (consumer/cli/boundary.py)
