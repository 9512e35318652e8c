"""The inputs every Kafka benchmark command resolves the same way: the model and the texts.

``--model`` is a model directory, ``sim:FIXED_MS,US_PER_TOKEN[,DIM]`` (a simulated device,
BENCHMARKS.md §Simulated device) or absent (the packaged MiniLM); the texts are sampled from
``--texts`` or the VADER corpus.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click

__all__ = [
    "bench_model",
    "bootstrap_option",
    "model_option",
    "progress_printer",
    "sample_texts",
    "texts_option",
]

model_option = click.option(
    "--model",
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    default=None,
    help="Model directory (default: the packaged all-MiniLM-L6-v2).",
)
texts_option = click.option(
    "--texts",
    "texts_file",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    default=None,
    help="JSONL/text file of texts (default: the VADER corpus).",
)
bootstrap_option = click.option(
    "--bootstrap",
    envvar="KBATCH_BOOTSTRAP",
    default="127.0.0.1:9092",
    show_default=True,
    help="Kafka bootstrap servers, comma-separated. (env KBATCH_BOOTSTRAP)",
)


def bench_model(model_name: str | None) -> tuple[Path, bool]:
    """Resolve ``--model``.

    Returns:
        The directory the benchmark's own model-side code loads (the packaged MiniLM for a
        simulated device, whose tokenizer it uses), and whether ``model_name`` is ``sim:…``.

    Raises:
        click.BadParameter: a malformed ``sim:`` spec, or a path that is not a directory.
    """
    from consumer.model.loader import packaged_model_dir
    from consumer.model.sim_backend import parse_sim

    try:
        sim = parse_sim(model_name or "") is not None
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--model") from err
    if model_name is None or sim:
        return packaged_model_dir(), sim
    model = Path(model_name)
    if not model.is_dir():
        raise click.BadParameter(f"{model_name}: not a directory", param_hint="--model")
    return model, False


def sample_texts(
    texts_file: Path | None, n: int, seed: int, *, distinct: bool = False
) -> list[str]:
    """``n`` texts sampled (with ``seed``) from ``texts_file`` or the VADER corpus; repeated
    when ``n`` exceeds the pool (:func:`producer_tools.corpus.sample`), or with ``distinct``
    at most the pool's size, none twice."""
    from producer_tools import corpus

    pool = corpus.load_file(texts_file) if texts_file else corpus.load_vader()
    return [t.text for t in corpus.sample(pool, min(n, len(pool)) if distinct else n, seed=seed)]


def progress_printer(command: str) -> Callable[[str], None]:
    """A ``say(msg)`` that prints ``[bench e2e   12.3 s] msg`` on stderr: the seconds since
    it was made."""
    import time

    t_start = time.monotonic()

    def say(msg: str) -> None:
        click.echo(f"[{command} {time.monotonic() - t_start:6.1f} s] {msg}", err=True)

    return say
