"""Start-up checks of ``kbatch serve`` and ``kbatch backfill``: cheap (no torch, no Kafka), run
before anything starts, each failure a usage error of one line."""

from __future__ import annotations

import click

from consumer.batching.config import BatchPolicyConfig
from consumer.model.settings import ModelSettings

__all__ = ["check_startup"]


def check_startup(settings: ModelSettings, policy: BatchPolicyConfig | None) -> None:
    """The model resolves and fits its task (:func:`consumer.model.loader.check_model`) and the
    token budget (``policy``; None: not checked) holds one request of the longest length the
    model takes.

    A budget below that length cannot form any batch: ``serve`` failed at its warm-up after the
    model had loaded, ``backfill`` ran batches of single truncated items.

    Raises:
        click.UsageError: the model is missing, has a file that is not JSON or no weights, or
            does not fit the task, or
            ``--max-batch-tokens`` is below the model's maximum length (or ``--max-length``).
    """
    from consumer.model.limits import read_max_length
    from consumer.model.loader import check_model

    try:
        model_dir = check_model(settings)
        max_length = settings.max_length or read_max_length(model_dir)
    except (FileNotFoundError, ValueError) as err:
        raise click.UsageError(str(err)) from err
    if policy is not None and policy.max_batch_tokens < max_length:
        limit = (
            f"--max-length {settings.max_length}"
            if settings.max_length
            else f"the model's maximum length, {max_length} tokens"
        )
        raise click.UsageError(
            f"--max-batch-tokens {policy.max_batch_tokens} cannot hold one request of "
            f"{limit}: give at least {max_length} (or a smaller --max-length)"
        )
