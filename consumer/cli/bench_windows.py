"""``kbatch bench windows``: a long document in windows against as many one-window requests
(contract 1.3; :mod:`consumer.bench.windows`)."""

from __future__ import annotations

from pathlib import Path

import click
from rich_click import RichCommand

from consumer.cli.extras import require_serve_extra
from consumer.cli.options import json_option, option

__all__ = ["windows_command"]


@click.command("windows", cls=RichCommand)
@click.option(
    "--model",
    "model_dir",
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    default=None,
    help="Model directory (default: the packaged all-MiniLM-L6-v2, task embed).",
)
@option(
    "--task",
    type=click.Choice(["embed", "token-classify"]),
    default="embed",
    help="What the model computes.",
)
@option(
    "--windows",
    type=click.IntRange(min=2),
    default=10,
    help="Windows of the long document (and separate requests beside it).",
)
@option(
    "--stride",
    type=click.IntRange(min=0),
    help="Tokens shared by consecutive windows (token-classify); default: an eighth of a window.",
)
@option("--repeats", type=click.IntRange(min=1), default=5, help="Runs of each case (alternated).")
@option("--device", default="cpu", help="'cpu', 'cuda', 'cuda:1'.")
@json_option
def windows_command(
    model_dir: Path | None,
    task: str,
    windows: int,
    stride: int | None,
    repeats: int,
    device: str,
    as_json: bool,
) -> None:
    """Model time and padding efficiency of one document of --windows windows against
    --windows separate one-window requests; within_1_1x in the report: both the document's
    model time and its padding are within 1.1x the separate requests'."""
    require_serve_extra()
    import json
    from typing import Literal, cast

    from consumer.bench.windows import WindowsBenchOptions, main
    from consumer.cli.bench_inputs import bench_model

    model, _ = bench_model(None if model_dir is None else str(model_dir))
    kind = cast(Literal["embed", "token-classify"], task)  # click.Choice guarantees it
    options = WindowsBenchOptions(model, kind, windows, stride, repeats, device)
    report = main(options)
    if as_json:
        click.echo(json.dumps(report))
        return
    for case in ("document", "separate"):
        c = report[case]
        click.echo(
            f"{case:9} model {c['model_ms_median']:9.2f} ms  padding {c['padding_efficiency']}"
            f"  tokens {c['real_tokens_per_run']}"
        )
    click.echo(
        f"ratio: model {report['model_ms_ratio']}x, padding {report['padding_ratio']}x "
        f"({'within' if report['within_1_1x'] else 'NOT within'} 1.1x)"
    )
