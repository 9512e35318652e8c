"""The options of contract 1.2's tasks (rerank, sparse, token-classify) against the served task
(CONTRACT.md §Additions in 1.2).

Pure (no torch, no I/O), the same two steps as the embed options (:mod:`consumer.options`):

1. at admission, :func:`check_task_options` refuses (``invalid_option``) an option of another
   task (rerank's ``query``, its name for ``text``, included), an embed option on a 1.2 task
   (``encoding_format`` excepted on sparse, not ``binary``), and a rerank request without
   ``documents``;
2. at reply time, :func:`shape_task_result` derives the request's ``result`` from the runner's
   (which holds everything every option needs), so dedup copies with other options share one
   computation: rerank's ``top_n``, sparse's ``top_k`` and ``encoding_format``,
   token-classify's ``aggregation`` and ``redact``.

:data:`TASK_OPTIONS` is the one list of the 1.2 option names and their task.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from consumer.entities import TOKENS, aggregate_windows, redact_windows
from consumer.options import OptionError, RequestOptions
from schemas.models import TASK_OPTIONS, Aggregation, Chunking, EncodingFormat, Request, Task
from schemas.sparse import SPARSE, sparse_result

__all__ = [
    "NEW_TASKS",
    "TASK_OPTIONS",
    "TaskOptionError",
    "TaskOptions",
    "check_task_options",
    "shape_task_result",
    "window_rule",
]

NEW_TASKS: Final[frozenset[Task]] = frozenset({"rerank", "sparse", "token-classify"})
"""The tasks of contract 1.2."""


SPARSE_ENCODINGS: Final = ("float", "f32le", "f16le")
"""The ``encoding_format`` values a sparse result can take (``binary`` has no meaning there)."""


FIRST_WINDOW: Final = "\x00first-window"
"""Dedup-key variant (in :func:`consumer.options.dedup_key`'s prompt place; no prompt name
holds a NUL) of a token-classify computation of the first window only: it never answers a copy
that wants the whole text."""


def window_rule(
    task: Task,
    truncate: bool | None,
    redact: bool | None,
    chunking: Chunking | None = None,
) -> tuple[bool, str | None]:
    """Whether a request runs in windows (contract 1.3), and its dedup-key variant.

    token-classify runs in windows whenever the text is longer than one — with ``truncate``
    absent or false (windows cut nothing) and, with ``redact``, whatever ``truncate`` says:
    a redaction never leaves text unscanned. Only ``truncate: true`` without ``redact`` keeps
    1.2's first window (``truncated: true``), under its own dedup variant
    (:data:`FIRST_WINDOW`). rerank alike (``redact`` is None there): a document longer than
    one window is scored per window (MaxP) unless ``truncate: true`` asks for 1.2's cut pair.
    embed: chunks when the request asks for ``chunking``, under a dedup variant naming
    ``max_tokens`` and ``overlap`` (what the model sees; ``output`` is shaped per copy).
    Other tasks: no windows (one sequence, as before).
    """
    if task == "embed" and chunking is not None:
        return True, f"\x00chunks:{chunking.max_tokens}:{chunking.overlap}"
    if task not in ("token-classify", "rerank"):
        return False, None
    if truncate is True and not redact:
        return False, FIRST_WINDOW
    return True, None


class TaskOptionError(OptionError):
    """A well-formed option this task cannot honour: the ``invalid_option`` reply's message."""


@dataclass(frozen=True, slots=True)
class TaskOptions(RequestOptions):
    """The reply-time options of one request (None: absent)."""

    top_n: int | None = None
    top_k: int | None = None
    encoding_format: EncodingFormat | None = None
    aggregation: Aggregation | None = None
    redact: bool | None = None


def check_task_options(request: object, task: Task) -> None:
    """Check ``request``'s 1.2 options (and embed options on a 1.2 task) against ``task``.

    ``request`` is a :class:`~schemas.models.Request`, or anything with its option names as
    attributes (``kbatch backfill``'s settings: one set of options for every record, the
    documents read from each record); an attribute it lacks counts as absent.

    Raises:
        TaskOptionError: an option of another task (``query`` too, on any task but rerank),
            an embed option on a 1.2 task other than ``encoding_format`` float/f32le/f16le on
            sparse, or rerank without ``documents``.
    """
    for name, owner in TASK_OPTIONS.items():
        if owner != task and getattr(request, name, None) is not None:
            raise TaskOptionError(f"{name} is a {owner} option; this model's task is {task}")
    if task != "rerank" and getattr(request, "named_query", False):
        raise TaskOptionError(
            f"query is a rerank field (the rerank query); this model's task is {task}: "
            "send the input as text"
        )
    if task not in NEW_TASKS:
        return
    if task == "rerank" and isinstance(request, Request) and request.documents is None:
        raise TaskOptionError("a rerank request needs documents (1 to 64 strings)")
    embed = [
        name
        for name in ("dimensions", "normalize", "prompt_name", "encoding_format")
        if getattr(request, name, None) is not None
    ]
    encoding_format = getattr(request, "encoding_format", None)
    if task == "sparse" and encoding_format in SPARSE_ENCODINGS:
        embed.remove("encoding_format")
    if embed:
        what = ", ".join(embed)
        if task == "sparse" and "encoding_format" in embed:
            what = f"encoding_format {encoding_format!r} (float, f32le or f16le)"
        raise TaskOptionError(f"{what}: not an option of task {task}")


def shape_task_result(result: Mapping[str, Any], options: TaskOptions) -> Mapping[str, Any]:
    """The contract ``result`` for ``options`` from a 1.2 runner result; other results
    unchanged.

    - rerank ``{"scores": [...]}``: plus ``top`` (``top_n`` best, highest first, ties by index;
      since 1.3 with the ``window`` a windowed document's score comes from, from the
      runner's ``windows``);
    - sparse (the runner's full vector under ``SPARSE``): ``indices``/``values``/``dim``/
      ``format`` (:func:`schemas.sparse.sparse_result`);
    - token-classify (the runner's per-token scores under ``TOKENS``: one
      :class:`~consumer.entities.TokenScores`, or a tuple of them, one per window of a long
      text): ``entities`` grouped as ``aggregation`` asks (default ``simple``) and merged
      across windows, plus ``redacted`` with ``redact`` (every window's entities replaced:
      :func:`consumer.entities.redact_windows`).
    """
    if TOKENS in result:
        tokens = result[TOKENS]
        windows = tokens if isinstance(tokens, tuple) else (tokens,)
        strategy = options.aggregation or "simple"
        shaped: dict[str, Any] = {"entities": aggregate_windows(windows, strategy)}
        if options.redact:
            shaped["redacted"] = redact_windows(windows, strategy)
        return shaped
    if SPARSE in result:
        indices, values = result[SPARSE]
        return sparse_result(
            indices,
            values,
            dim=int(result["dim"]),
            top_k=options.top_k,
            encoding_format=options.encoding_format or "float",
        )
    scores = result.get("scores")
    if not isinstance(scores, list):
        return result
    if options.top_n is None:
        return {"scores": scores} if "windows" in result else result
    where = result.get("windows") or [None] * len(scores)
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[: options.top_n]
    top: list[dict[str, Any]] = []
    for i in order:
        entry: dict[str, Any] = {"index": i, "score": scores[i]}
        if where[i] is not None:
            entry["window"] = where[i]
        top.append(entry)
    return {"scores": scores, "top": top}
