"""The errors of the batching engine (``consumer.batching``): one tree, a ``retriable`` flag.

::

    BatchingError                   base of what consumer.batching raises (a RuntimeError)
     └── EngineClosedError          submit on an engine that is not started, or is stopping;
                                    not retriable on this engine

The engine never raises for a model error: the runner answers a failing item
``inference_failed`` (``consumer.model.errors``). ``retriable`` means "the same call may
succeed later", as in ``consumer.kafka.errors`` and ``schemas.errors``.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = ["BatchingError", "EngineClosedError"]


class BatchingError(RuntimeError):
    """Base of every error the batching engine raises."""

    retriable: ClassVar[bool] = False


class EngineClosedError(BatchingError):
    """``submit`` on an engine that is not started, or is stopping."""
