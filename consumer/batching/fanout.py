"""Rerank's fan-out (contract 1.2): one request of N documents runs as N pair items, one
outcome comes back.

Pure (asyncio only for the awaits it passes through). :class:`FanOutEngine` sits between the
owner (serve's pipeline, backfill's job) and the :class:`~consumer.batching.engine.Engine`:

- ``submit``: an item with ``documents`` becomes one item per (query, document) pair
  (``text`` = the query, ``text_pair`` = the document), each with its own engine id, the
  request's deadline, group and truncate flag. Each pair is one sequence: it is tokenized,
  bucketed, budgeted and truncated on its own, so a request's pairs may run in different
  batches. Items without documents pass through (under an engine id of their own too).
  Returns each submitted item's tokens: the sum over its pairs.
- ``on_outcomes``: when every pair of an item has its outcome, the item's one outcome goes to
  the owner: ``ok`` with ``result = {"scores": [...]}`` in document order when all pairs are
  ok; else the first pair's error (an ``error`` before an ``expired``). ``n_tokens`` is the sum
  over the pairs (what the model saw: ``usage.tokens``), ``truncated`` whether any pair was
  cut, the timing the slowest pair's (``queue_ms``, ``infer_ms`` and ``padded_len`` the
  largest, ``batch_size`` the largest batch).
- ``cancel_group``: cancels the pairs queued for the group and forgets the items they belong
  to (running pairs' outcomes are then ignored); returns the items' ids.

Everything else (``start``, ``flush``, ``drain``, ``stop``, ``warm``, ``healthy``,
``queued_items`` …) is the engine's.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from consumer.batching.types import InferenceItem, ItemOutcome

__all__ = ["FanOutEngine", "gather_outcomes"]


@dataclass(slots=True)
class _Gather:
    """The outcomes of one submitted item's pairs, by pair index."""

    item: InferenceItem
    outcomes: list[ItemOutcome | None] = field(default_factory=list)
    left: int = 0


def gather_outcomes(item_id: int, outcomes: Sequence[ItemOutcome]) -> ItemOutcome:
    """One item's outcome from its pairs' outcomes (in document order); see the module doc.

    A pair's ``ok`` result is ``{"score": float}``.
    """
    first = outcomes[0]
    failed = [o for o in outcomes if o.status == "error"] or [
        o for o in outcomes if o.status == "expired"
    ]
    n_tokens = sum(o.n_tokens for o in outcomes)
    truncated = any(o.truncated for o in outcomes)
    if failed:
        bad = failed[0]
        return replace(bad, item_id=item_id, n_tokens=n_tokens, truncated=truncated, result=None)
    scores: list[float] = []
    for o in outcomes:
        assert o.result is not None
        scores.append(float(o.result["score"]))
    return ItemOutcome(
        item_id=item_id,
        status="ok",
        result={"scores": scores},
        error_code=None,
        error_message=None,
        truncated=truncated,
        n_tokens=n_tokens,
        queue_ms=max(o.queue_ms for o in outcomes),
        infer_ms=max(o.infer_ms for o in outcomes),
        batch_size=max(o.batch_size for o in outcomes),
        padded_len=max(o.padded_len for o in outcomes),
        group=first.group,
    )


class FanOutEngine:
    """An engine wrapper that runs rerank items as pairs (see the module docstring).

    Args:
        on_outcomes: the owner's callback; gets each submitted item's one outcome.

    Build it first, give its :meth:`on_outcomes` to the ``Engine``, then :meth:`bind` the
    engine; hand the wrapper to the owner as its engine.
    """

    def __init__(self, on_outcomes: Callable[[Sequence[ItemOutcome]], None]) -> None:
        self._owner_on_outcomes = on_outcomes
        self._engine: Any = None
        self._ids = itertools.count()
        self._gathers: dict[int, _Gather] = {}  # submitted item id → its pairs' outcomes
        self._pairs: dict[int, tuple[int, int]] = {}  # engine id → (item id, pair index)

    def bind(self, engine: Any) -> None:
        """Attach the engine (built after this wrapper: it calls :meth:`on_outcomes`)."""
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        # start, flush, drain, stop, warm, healthy, queued_*: the engine's own.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._engine, name)

    async def submit(self, items: Sequence[InferenceItem]) -> list[int]:
        """Submit ``items`` as pairs; each item's tokens (the sum over its pairs), in order."""
        expanded: list[InferenceItem] = []
        spans: list[tuple[int, int]] = []
        for item in items:
            docs = item.documents
            subs = (
                [replace(item, documents=None, text_pair=d) for d in docs]
                if docs
                else [replace(item)]
            )
            gather = _Gather(item, [None] * len(subs), len(subs))
            self._gathers[item.item_id] = gather
            start = len(expanded)
            for index, sub in enumerate(subs):
                sub.item_id = next(self._ids)
                self._pairs[sub.item_id] = (item.item_id, index)
                expanded.append(sub)
            spans.append((start, len(expanded)))
        n_tokens = await self._engine.submit(expanded)
        return [sum(n_tokens[a:b]) for a, b in spans]

    def cancel_group(self, group: object) -> list[int]:
        """Cancel ``group``'s queued pairs; the ids of the items they belong to (forgotten)."""
        cancelled: list[int] = []
        for engine_id in self._engine.cancel_group(group):
            item_id, _ = self._pairs.pop(engine_id, (None, 0))
            if item_id is not None and self._gathers.pop(item_id, None) is not None:
                cancelled.append(item_id)
        for engine_id in [e for e, (i, _) in self._pairs.items() if i in cancelled]:
            del self._pairs[engine_id]
        return cancelled

    def on_outcomes(self, outcomes: Sequence[ItemOutcome]) -> None:
        """The engine's callback: the items whose last pair this call completes, together."""
        done: list[ItemOutcome] = []
        for outcome in outcomes:
            item_id, index = self._pairs.pop(outcome.item_id, (None, 0))
            gather = None if item_id is None else self._gathers.get(item_id)
            if item_id is None or gather is None:
                continue  # its item was cancelled
            gather.outcomes[index] = outcome
            gather.left -= 1
            if gather.left == 0:
                del self._gathers[item_id]
                finished = [o for o in gather.outcomes if o is not None]
                if gather.item.documents:
                    done.append(gather_outcomes(item_id, finished))
                else:
                    done.append(replace(finished[0], item_id=item_id))
        if done:
            self._owner_on_outcomes(done)
