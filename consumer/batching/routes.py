"""Where each submitted item's outcome goes: the callback its submit named (else a default).

Every producer of items (serve's pipeline, a backfill job, a serve backfill job, the fan-out's
parts) says where its outcomes go when it submits them, so no engine holds its owners and
nothing is bound after construction. Pure: no asyncio, no I/O.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Sequence

from consumer.batching.types import ItemOutcome

__all__ = ["OutcomeCallback", "OutcomeRoutes", "call_each"]

log = logging.getLogger(__name__)

OutcomeCallback = Callable[[list[ItemOutcome]], None]
"""Receives a list of outcomes on the event loop thread."""


class OutcomeRoutes:
    """Each item's callback from its submit until its outcome is out; an item routed nowhere
    goes to the default :meth:`emit` is given."""

    def __init__(self) -> None:
        self._by_id: dict[int, OutcomeCallback] = {}
        self._ids = itertools.count(-1, -1)

    def new_id(self) -> int:
        """A fresh item id (negative: never one of the ids an owner counts up from 0)."""
        return next(self._ids)

    def add(self, item_ids: Sequence[int], callback: OutcomeCallback | None) -> None:
        """Route ``item_ids`` to ``callback`` (None: the default, nothing to remember).

        Raises:
            ValueError: an id already routed (in flight).
        """
        if callback is None:
            return
        clash = [i for i in item_ids if i in self._by_id]
        if clash:
            raise ValueError(f"item ids already in flight: {clash[:5]}")
        self._by_id.update(dict.fromkeys(item_ids, callback))

    def forget(self, item_ids: Iterable[int]) -> None:
        """Items that will get no outcome (cancelled)."""
        for i in item_ids:
            self._by_id.pop(i, None)

    def clear(self) -> None:
        self._by_id.clear()

    def emit(self, outcomes: list[ItemOutcome], default: OutcomeCallback | None) -> None:
        """Hand ``outcomes`` to their callbacks (``default`` for those routed nowhere), each
        callback's part in one call, in order."""
        by_id = self._by_id
        if not by_id and default is not None:
            call_each([(default, outcomes)])
            return
        groups: list[tuple[OutcomeCallback, list[ItemOutcome]]] = []
        lost: list[int] = []
        for o in outcomes:
            callback = by_id.pop(o.item_id, default)
            if callback is not None:
                add_to(groups, callback, o)
            else:
                lost.append(o.item_id)
        if lost:  # a submit without a callback on an engine without a default: a bug
            log.error("outcomes of items %s have no callback: dropped", lost[:10])
        call_each(groups)


def add_to(
    groups: list[tuple[OutcomeCallback, list[ItemOutcome]]],
    callback: OutcomeCallback,
    outcome: ItemOutcome,
) -> None:
    """Append ``outcome`` to ``callback``'s group (compared with ``==``: a bound method is a
    new object at each access, and some, like ``list.extend``, cannot be hashed)."""
    for known, group in groups:
        if known == callback:
            group.append(outcome)
            return
    groups.append((callback, [outcome]))


def call_each(groups: Iterable[tuple[OutcomeCallback, list[ItemOutcome]]]) -> None:
    """Call each callback with its outcomes; an exception is logged and ignored (one owner's
    bug never stops the engine or another owner's outcomes)."""
    for callback, outcomes in groups:
        try:
            callback(outcomes)
        except Exception:
            log.exception("on_outcomes raised for items %s", [o.item_id for o in outcomes])
