"""``kbatch load``: open-loop load against a running ``kbatch serve``, with reports and plots.

The mechanics live in :mod:`producer_tools.load` (schedule, sends, waits) and
:mod:`producer_tools.report` (the statistics and their definitions); this module only turns
flags into :class:`producer_tools.load.LoadOptions` and prints.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import click
from rich_click import RichCommand

from consumer.cli.boundary import EXIT_INTERRUPTED, EXIT_TERMINATED
from consumer.cli.client_security import SECURITY_FIELDS, client_kafka_options, security_options
from consumer.cli.options import POSITIVE, CommaList, OutputDir, flag, option, seed_option
from consumer.cli.request import encoding_option, topic_options


@click.command("load", cls=RichCommand)
@option(
    "--pattern",
    type=click.Choice(["constant", "poisson", "step", "pulse"]),
    default="constant",
    help="constant: evenly spaced; poisson: exponential gaps; step: a rate sweep; "
    "pulse: base rate with bursts.",
)
@option(
    "--rate",
    "rate_per_s",
    type=POSITIVE,
    default=20.0,
    help="Requests per second (pulse: the base rate; step: the first step, see --steps).",
)
@option(
    "--duration-s",
    type=POSITIVE,
    help="Measured length (default 20 s; step: steps x --step-s). Warm-up comes on top.",
)
@option(
    "--count",
    type=click.IntRange(min=1),
    help="Measured requests: stop after this many (constant/poisson: instead of a duration).",
)
@option(
    "--corpus",
    default="vader",
    help="'vader' (the VADER texts, fetched once) or a JSONL/text file.",
)
@option(
    "--warmup-s",
    type=click.FloatRange(min=0),
    default=2.0,
    help="Seconds of load at the first rate before measuring (sent, left out of the report).",
)
@option(
    "--rates",
    "rates_per_s",
    type=CommaList(float),
    help="step: the rates of the sweep, e.g. 5,10,20,40 (default: --rate x 1..--steps).",
)
@option(
    "--steps", type=click.IntRange(min=1), default=5, help="step: number of rates in the sweep."
)
@option(
    "--knee-p99-factor",
    type=POSITIVE,
    default=3.0,
    help="step: a step whose p99 exceeds this x the first step's p99 is saturated (as is "
    "one whose replies/s fall below 0.9 x offered, or that timed requests out); the knee "
    "is the step before the first saturated one.",
)
@option(
    "--knee-p99-ms",
    type=POSITIVE,
    help="step: a latency budget: a step whose p99 exceeds it is saturated too.",
)
@option("--step-s", type=POSITIVE, default=10.0, help="step: seconds per step.")
@option("--burst-factor", type=POSITIVE, default=5.0, help="pulse: burst rate = factor x --rate.")
@option("--burst-s", type=POSITIVE, default=2.0, help="pulse: burst length.")
@option(
    "--burst-every-s",
    type=POSITIVE,
    default=10.0,
    help="pulse: seconds from one burst's start to the next.",
)
@option(
    "--first-burst-s",
    type=click.FloatRange(min=0),
    help="pulse: start of the first burst after the warm-up (default: half the period).",
)
@option(
    "--after-s",
    type=POSITIVE,
    help="pulse: window after each burst reported as 'after burst' (default 2 x --burst-s).",
)
@flag(
    "--poisson-arrivals",
    help="step/pulse: exponential gaps at each segment's rate instead of even spacing.",
)
@seed_option("Texts and Poisson gaps.")
@option(
    "--timeout-s",
    type=POSITIVE,
    default=30.0,
    help="A request without a reply after this long counts as a timeout.",
)
@option(
    "--deadline-after-ms",
    type=click.IntRange(min=0),
    help="Give each request deadline_ms = send time + this (late ones come back expired).",
)
@option(
    "--task",
    type=click.Choice(["embed", "classify"]),
    help="Each request's task (default: none, whatever the served model does).",
)
@option(
    "--metrics-url",
    help="The server's /metrics URL, e.g. http://127.0.0.1:9400/metrics: "
    "adds padding efficiency from its token counters.",
)
@option(
    "--max-error-rate",
    type=click.FloatRange(0, 1),
    default=0.0,
    help="Exit 1 when more than this fraction of measured requests failed (timeouts, error "
    "replies, send failures; expired replies do not count).",
)
@flag("--no-probe", help="Skip the probe request before the run.")
@flag(
    "--traceparent",
    help="Send a W3C traceparent (a new sampled trace) with each request; the report names "
    "the slowest requests' trace ids, to look up in a tracing backend (kbatch serve "
    "--tracing; docs/TRACING.md).",
)
@flag("--json", "as_json", help="Print one JSON object (no tables).")
@option("--plots-dir", type=OutputDir(), help="Write PNG plots here.")
@option("--plots-prefix", help="File name prefix (default: the pattern).")
@flag("--no-progress", help="No progress bar on stderr.")
@encoding_option
@topic_options
@security_options
def load_command(
    corpus: str,
    as_json: bool,
    plots_dir: Path | None,
    plots_prefix: str | None,
    no_progress: bool,
    no_probe: bool,
    max_error_rate: float,
    encoding: str,
    poisson_arrivals: bool,
    **opts: Any,
) -> None:
    """Open-loop load on real texts: latency percentiles, throughput, knee, bursts, plots.

    Send times are fixed before the run (a slow server shows as latency, not as a lower send
    rate); latency is measured from each request's scheduled send time to its reply. Exits 1
    when the error rate is above --max-error-rate (default 0: any timeout fails the run).
    """

    from producer_tools import corpus as corpus_mod
    from producer_tools.client import ClientError
    from producer_tools.load import (
        LoadError,
        LoadOptions,
        metrics_url_problem,
        run_load,
        write_plots,
    )
    from producer_tools.report import error_rate, print_report, report_console
    from schemas.codec import Encoding

    if opts.get("metrics_url") and (problem := metrics_url_problem(opts["metrics_url"])):
        raise click.BadParameter(problem, param_hint="--metrics-url")
    try:
        if corpus == "vader":
            pool = corpus_mod.load_vader()
        else:
            path = Path(corpus)
            if not path.is_file():
                raise click.BadParameter(
                    f"{corpus} is neither 'vader' nor a file", param_hint="--corpus"
                )
            pool = corpus_mod.load_file(path)
        texts = [t.text for t in corpus_mod.sample(pool, len(pool), seed=opts["seed"])]
    except (corpus_mod.CorpusError, ValueError) as err:
        raise click.ClickException(f"cannot load the corpus: {err}") from err
    security = {name: opts.pop(name) for name in SECURITY_FIELDS if name in opts}
    kafka_options = client_kafka_options(opts["bootstrap"], security)
    options = LoadOptions(
        texts=texts,
        encoding=Encoding.JSON if encoding == "json" else Encoding.MSGPACK,
        poisson=poisson_arrivals,
        probe=not no_probe,
        client_options={"kafka_options": kafka_options},
        **opts,
    )
    try:
        run = asyncio.run(run_load(options, progress=not no_progress))
    except (LoadError, ClientError) as err:
        raise click.ClickException(str(err)) from err
    except ValueError as err:
        raise click.UsageError(str(err)) from err
    if plots_dir is not None:
        write_plots(run, plots_dir, plots_prefix or options.pattern)
    if as_json:
        click.echo(json.dumps(run.report))
    else:
        print_report(run.report, report_console())
    if run.interrupted:  # Ctrl-C, SIGTERM: the report above covers the requests sent until then
        cut = run.report["interrupted"]
        click.echo(
            f"kbatch load: interrupted ({cut['signal']}) at {cut['at_s']:.1f} s: the report "
            "covers the "
            f"{cut['sent']} of {cut['scheduled']} requests sent "
            f"({cut['unanswered_in_flight']} still in flight, counted unanswered)",
            err=True,
        )
        raise SystemExit(EXIT_TERMINATED if cut["signal"] == "SIGTERM" else EXIT_INTERRUPTED)
    rate = error_rate(run.report["summary"])
    if rate > max_error_rate:
        first = run.report.get("first_error")
        click.echo(
            f"kbatch load: error rate {rate:.2%} is above --max-error-rate {max_error_rate:.2%}"
            + (f" (first error: {first})" if first is not None else ""),
            err=True,
        )
        raise SystemExit(1)
