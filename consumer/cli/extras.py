"""The commands that serve a model need the ``[serve]`` extra; the client commands do not.

``pip install kbatch`` is the client (the Python client, ``kbatch request``, ``load``,
``topics``, ``broker``, ``backfill submit/status/cancel``): no torch. ``kbatch serve``,
``backfill`` (a run), ``bench`` and ``demo`` call :func:`require_serve_extra` before importing
anything of the model layer, so a client install answers them with one line naming what to
install instead of a traceback.
"""

from __future__ import annotations

import click

__all__ = ["require_serve_extra"]


def require_serve_extra() -> None:
    """Raise a one-line ``click.ClickException`` (exit 1) unless torch and transformers are
    installed (:func:`consumer.model.errors.require_model_libraries`)."""
    from consumer.model.errors import ModelLibrariesMissingError, require_model_libraries

    try:
        require_model_libraries()
    except ModelLibrariesMissingError as err:
        raise click.ClickException(str(err)) from None
