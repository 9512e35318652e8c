"""``kbatch demo``: the README's first command — serve MiniLM on real texts and show it."""

from __future__ import annotations

from pathlib import Path

import click
from rich_click import RichCommand

from consumer.cli.extras import require_serve_extra
from consumer.cli.options import OutputDir, option


@click.command("demo", cls=RichCommand)
@option("--steady-s", type=float, default=30.0, help="Steady phase length, seconds.")
@option("--steady-rate", type=float, default=30.0, help="Requests/s, steady.")
@option("--pulse-s", type=float, default=30.0, help="Pulse phase length, seconds.")
@option("--plots-dir", type=OutputDir(), help="Write PNG plots here.")
@option(
    "--broker-port",
    type=int,
    default=9092,
    envvar="KBATCH_BROKER_PORT",
    help="Port of the local broker it starts (env KBATCH_BROKER_PORT, as kbatch broker start).",
)
def demo_command(
    steady_s: float, steady_rate: float, pulse_s: float, plots_dir: Path | None, broker_port: int
) -> None:
    """Start the local broker and `kbatch serve --model minilm`, drive it with a steady phase
    and a pulse of VADER texts, print the reports and sample replies, then stop the server
    (the broker keeps running)."""
    require_serve_extra()
    from producer_tools.demo import DemoOptions, run_demo

    options = DemoOptions(
        steady_rate_per_s=steady_rate,
        steady_s=steady_s,
        pulse_s=pulse_s,
        plots_dir=plots_dir,
        broker_port=broker_port,
    )
    raise SystemExit(run_demo(options))
