"""Fan-out: one request runs as several sequences, one outcome comes back — rerank's pairs
(contract 1.2) and the windows of a long text (contract 1.3).

Pure (asyncio only for the awaits it passes through). :class:`FanOutEngine` sits between the
owner (serve's pipeline, backfill's job) and the :class:`~consumer.batching.engine.Engine`:

- ``submit``: an item with ``documents`` becomes one item per (query, document) pair
  (``text`` = the query, ``text_pair`` = the document), each with its own engine id, the
  request's deadline, group and truncate flag. Each pair is one sequence: it is tokenized,
  bucketed, budgeted and truncated on its own, so a request's pairs may run in different
  batches. Items without documents pass through (under an engine id of their own too).
  Returns each submitted item's tokens: the sum over its pairs.
- windows (contract 1.3): an item with ``windows`` set is split by the ``windower`` (in a
  worker thread: it tokenizes) into one item per window
  (:class:`~consumer.batching.types.Window`, tokenized already), each with its own engine id,
  the request's deadline, group and lane; a text over the windower's caps is answered
  ``input_too_long`` (after ``submit`` returns), never cut. When every window has its outcome
  the item's one outcome is ``ok`` with ``result = {TOKENS: (scores of window 0, 1, …)}``
  (token-classify: :func:`consumer.replies.task_options.shape_task_result` merges them), else the
  first window's error; ``n_tokens``, ``truncated`` and timing as for pairs.
- ``on_outcomes`` (the parts' callback, which ``submit`` names to the engine): when every
  pair of an item has its outcome, the item's one outcome goes where its submit said: ``ok``
  with ``result = {"scores": [...]}`` in document order when all pairs are ok; else the
  first pair's error (an ``error`` before an ``expired``). ``n_tokens`` is the sum over the
  pairs (what the model saw: ``usage.tokens``), ``truncated`` whether any pair was
  cut, the timing the slowest pair's (``queue_ms``, ``infer_ms`` and ``padded_len`` the
  largest, ``batch_size`` the largest batch).
- ``cancel_group``: cancels the pairs queued for the group and forgets the items they belong
  to (running pairs' outcomes are then ignored); returns the items' ids.

Everything else (``start``, ``flush``, ``drain``, ``stop``, ``warm``, ``healthy``,
``queued_items`` …) is the engine's.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Protocol

from consumer.batching.routes import OutcomeCallback, add_to, call_each
from consumer.batching.types import InferenceItem, ItemOutcome, Rejected, Window
from consumer.entities import TOKENS
from schemas.errors import ErrorCode

CHUNKS: Final = "chunk_results"
"""Key of a chunked embed item's gathered result (contract 1.3): not the contract's ``chunks``,
which a shaped result holds (a shaped result must never look unshaped)."""

NO_CHUNKS: Final = "this server cannot chunk texts (its model has no tokenizer): send no chunking"
"""The ``invalid_option`` message of a ``chunking`` request to a fan-out without a windower."""

PART_IDS: Final = 1 << 62
"""The fan-out's engine ids for parts (pairs, windows) count up from here: never an owner's
(serve's and backfill's count up from 0, routed ones are negative), so an outcome below it is
an item submitted as it is, passed through."""

__all__ = ["CHUNKS", "PART_IDS", "FanOutEngine", "Windower", "gather_outcomes", "gather_windows"]


class Windower(Protocol):
    """Splits long texts into windows (:class:`consumer.model.windows.TokenWindows`)."""

    def split(self, items: Sequence[InferenceItem]) -> list[list[InferenceItem] | Rejected]:
        """Each item's window items (``window`` set), or its ``input_too_long`` rejection."""
        ...


@dataclass(slots=True)
class _Gather:
    """The outcomes of one submitted item's pairs, by pair index."""

    item: InferenceItem
    outcomes: list[ItemOutcome | None] = field(default_factory=list)
    left: int = 0
    route: OutcomeCallback | None = None  # where the item's outcome goes
    windows: list[Window | None] | None = None  # the parts' windows (split items)


def gather_outcomes(
    item_id: int,
    outcomes: Sequence[ItemOutcome],
    windows: Sequence[Window | None] | None = None,
) -> ItemOutcome:
    """One item's outcome from its pairs' outcomes (in document order); see the module doc.

    A pair's ``ok`` result is ``{"score": float}``. With ``windows`` (each pair's
    :class:`~consumer.batching.types.Window`, contract 1.3) a document's score is its best
    window's (MaxP; the first on a tie), and ``result["windows"]`` says, per document, which
    window that was (``{"index", "count", "start", "end"}``; None for a one-window document).
    """
    if windows is None or all(w is None for w in windows):
        return _gather(
            item_id, outcomes, lambda results: {"scores": [float(r["score"]) for r in results]}
        )
    return _gather(item_id, outcomes, lambda results: _max_p(results, windows))


def _max_p(results: list[dict[str, Any]], windows: Sequence[Window | None]) -> dict[str, Any]:
    """Each document's best window's score and where that window is (see gather_outcomes)."""
    best: dict[int, tuple[float, Window | None]] = {}
    for index, (result, window) in enumerate(zip(results, windows, strict=True)):
        doc = index if window is None else window.document
        score = float(result["score"])
        if doc not in best or score > best[doc][0]:
            best[doc] = (score, window)
    ordered = [best[d] for d in sorted(best)]
    return {
        "scores": [score for score, _ in ordered],
        "windows": [
            None
            if w is None or w.count == 1
            else {"index": w.index, "count": w.count, "start": w.start, "end": w.end}
            for _, w in ordered
        ],
    }


def gather_windows(
    item_id: int,
    outcomes: Sequence[ItemOutcome],
    windows: Sequence[Window | None] | None = None,
) -> ItemOutcome:
    """One item's outcome from its windows' outcomes (in window order); see the module doc.

    token-classify: a window's ``ok`` result holds its token scores under ``TOKENS``; the
    item's holds the tuple of them. embed chunks (contract 1.3): the item's result holds,
    under ``CHUNKS``, one ``(result, n_tokens, start, end)`` per chunk — the runner's
    result, the chunk's tokens and its span in the text (:mod:`consumer.replies.chunking`
    shapes it).
    """
    spans = [(0, 0) if w is None else (w.start, w.end) for w in windows or [None] * len(outcomes)]

    def combine(results: list[dict[str, Any]]) -> dict[str, Any]:
        if TOKENS in results[0]:
            return {TOKENS: tuple(r[TOKENS] for r in results)}
        return {
            CHUNKS: tuple(
                (r, o.n_tokens, start, end)
                for r, o, (start, end) in zip(results, outcomes, spans, strict=True)
            )
        }

    return _gather(item_id, outcomes, combine)


def _gather(
    item_id: int,
    outcomes: Sequence[ItemOutcome],
    combine: Callable[[list[dict[str, Any]]], dict[str, Any]],
) -> ItemOutcome:
    """The item's outcome: ``combine`` of the parts' results when all are ok, else the first
    error (before an expiry); tokens summed, ``truncated`` any, timing the slowest part's."""
    first = outcomes[0]
    failed = [o for o in outcomes if o.status == "error"] or [
        o for o in outcomes if o.status == "expired"
    ]
    n_tokens = sum(o.n_tokens for o in outcomes)
    truncated = any(o.truncated for o in outcomes)
    if failed:
        bad = failed[0]
        return replace(bad, item_id=item_id, n_tokens=n_tokens, truncated=truncated, result=None)
    results: list[dict[str, Any]] = []
    for o in outcomes:
        assert o.result is not None
        results.append(o.result)
    return ItemOutcome(
        item_id=item_id,
        status="ok",
        result=combine(results),
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
    """An engine wrapper that runs rerank items as pairs and long texts as windows (see the
    module docstring).

    Args:
        engine: the :class:`~consumer.batching.engine.Engine` (or its stand-in); the parts
            are submitted to it with :meth:`on_outcomes` as their callback.
        on_outcomes: where the outcomes of a submit that names no callback go; None: every
            submit names one (serve's pipeline, a backfill job).
        windower: splits items with ``windows`` set; None: such items run as one sequence.

    Hand the wrapper to the owner as its engine.
    """

    def __init__(
        self,
        engine: Any,
        on_outcomes: OutcomeCallback | None = None,
        windower: Windower | None = None,
    ) -> None:
        self._engine = engine
        self._default = on_outcomes
        self._windower = windower
        self._ids = itertools.count(PART_IDS)
        self._gathers: dict[int, _Gather] = {}  # submitted item id → its pairs' outcomes
        self._pairs: dict[int, tuple[int, int]] = {}  # engine id → (item id, pair index)

    def __getattr__(self, name: str) -> Any:
        # start, flush, drain, stop, warm, healthy, queued_*: the engine's own.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._engine, name)

    async def submit(
        self,
        items: Sequence[InferenceItem],
        on_outcomes: OutcomeCallback | None = None,
    ) -> list[int]:
        """Submit ``items`` as pairs and windows; each item's tokens (the sum over its parts),
        in order (a refused item: its length as the windower measured it).

        ``on_outcomes``: where these items' outcomes go, else the default (construction).

        Raises:
            ValueError: no callback and no default; an item's id already in flight.
        """
        route = on_outcomes if on_outcomes is not None else self._default
        if route is None:
            raise ValueError("submit names no on_outcomes and there is no default")
        windowed: dict[int, list[InferenceItem] | Rejected] = {}
        to_split = [it for it in items if it.windows and self._windower is not None]
        if to_split:
            assert self._windower is not None
            splits = await asyncio.to_thread(self._windower.split, to_split)
            windowed = {id(it): s for it, s in zip(to_split, splits, strict=True)}
        expanded: list[InferenceItem] = []
        # parts in ``expanded``; a refused length (≥ 0); -1 - index in ``plain``
        spans: list[tuple[int, int] | int] = []
        refused: list[ItemOutcome] = []
        plain: list[InferenceItem] = []
        for item in items:
            docs = item.documents
            split = windowed.get(id(item))
            if split is None and item.chunking is not None:  # no windower: cannot chunk
                split = Rejected(item, 0, ErrorCode.INVALID_OPTION, NO_CHUNKS)
            if isinstance(split, Rejected):
                refused.append(_refused(split))
                spans.append(split.n_tokens)
                continue
            if item.item_id in self._gathers:
                raise ValueError(f"item id already in flight: {item.item_id}")
            if split is None and not docs:
                spans.append(-1 - len(plain))  # as it is: the engine's own outcome
                plain.append(item)
                continue
            if split is not None:
                subs = split
            else:
                subs = [replace(item, documents=None, text_pair=d) for d in docs or ()]
            parts = [sub.window for sub in subs] if split is not None else None
            gather = _Gather(item, [None] * len(subs), len(subs), route, parts)
            self._gathers[item.item_id] = gather
            start = len(expanded)
            for index, sub in enumerate(subs):
                sub.item_id = next(self._ids)
                self._pairs[sub.item_id] = (item.item_id, index)
                expanded.append(sub)
            spans.append((start, len(expanded)))
        if refused:
            asyncio.get_running_loop().call_soon(route, refused)
        n_tokens = await self._engine.submit(expanded, self.on_outcomes) if expanded else []
        n_plain = await self._engine.submit(plain, route) if plain else []
        return [
            sum(n_tokens[s[0] : s[1]])
            if isinstance(s, tuple)
            else (s if s >= 0 else n_plain[-1 - s])
            for s in spans
        ]

    def new_routed_id(self) -> int:
        """The engine's (ids for items submitted with their own ``on_outcomes``)."""
        return int(self._engine.new_routed_id())

    async def flush(self) -> None:
        """The engine's: run the partial batches now."""
        await self._engine.flush()

    def cancel_group(self, group: object) -> list[int]:
        """Cancel ``group``'s queued pairs; the ids of the items they belong to (forgotten)."""
        cancelled: list[int] = []
        for engine_id in self._engine.cancel_group(group):
            if engine_id < PART_IDS:  # an item submitted as it is
                cancelled.append(engine_id)
                continue
            item_id, _ = self._pairs.pop(engine_id, (None, 0))
            if item_id is not None and self._gathers.pop(item_id, None) is not None:
                cancelled.append(item_id)
        for engine_id in [e for e, (i, _) in self._pairs.items() if i in cancelled]:
            del self._pairs[engine_id]
        return cancelled

    def on_outcomes(self, outcomes: Sequence[ItemOutcome]) -> None:
        """The parts' callback: the items whose last part this call completes go together to
        each one's callback."""
        routed: list[tuple[OutcomeCallback, list[ItemOutcome]]] = []
        for outcome in outcomes:
            if outcome.item_id < PART_IDS:  # an item submitted as it is (the engine routes
                if self._default is not None:  # it; here when a caller hands it over)
                    add_to(routed, self._default, outcome)
                continue
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
                    one = gather_outcomes(item_id, finished, gather.windows)
                else:
                    one = gather_windows(item_id, finished, gather.windows)
                assert gather.route is not None
                add_to(routed, gather.route, one)
        call_each(routed)


def _refused(rejected: Rejected) -> ItemOutcome:
    """The outcome of an item the windower refused (``input_too_long``, ``invalid_option``):
    an error, never computed (no timing)."""
    item, code, message = rejected.item, rejected.error_code, rejected.error_message
    return ItemOutcome(item.item_id, "error", None, code, message, False, rejected.n_tokens,
                       0.0, 0.0, 0, 0, item.group)  # fmt: skip
