"""Token scores → entities and redaction (contract 1.2, task ``token-classify``).

Pure numpy. The rules are transformers' ``TokenClassificationPipeline`` (``gather_pre_entities``,
``aggregate``, ``aggregate_words``, ``group_entities``, ``postprocess`` with ``ignore_labels``
``["O"]``), applied to the runner's per-token softmax scores, so dedup copies of a key with
other ``aggregation``/``redact`` options share one computation:

- ``none``: one entity per token, its argmax label (``B-PER``);
- ``simple``: per-token argmax, then adjacent tokens of the same tag merged (a ``B-`` starts a
  new entity), score the tokens' mean;
- ``first`` / ``max`` / ``average``: words first (a word is a token and its continuing
  subwords, :class:`consumer.batching.types.TokenAlignment`), labelled by the first token's
  argmax, the argmax of the token with the highest score, or the argmax of the mean scores;
  then merged as ``simple``;
- entities labelled ``O`` are left out; the ``B-``/``I-`` prefix is removed except with
  ``none``.

An entity's ``text`` is the request text's ``[start, end)`` (the pipeline's ``word`` is the
decoded tokens instead: lower-cased by an uncased tokenizer). :func:`redact` replaces each
entity's span by ``[LABEL]``.

Long texts (contract 1.3) come as windows, one :class:`TokenScores` each (the tokenizer's
overflow windows, :mod:`consumer.model.windows`). :func:`aggregate_windows` is the pipeline
with ``stride``: each window's entities as above, then ``aggregate_overlapping_entities``
(sorted by start; of two overlapping entities the longer stays, on equal length the higher
score). That merge may drop an entity that a longer one only partly covers, so redaction does
not use the merged list alone: :func:`redact_windows` replaces the *union* of every window's
entities, so a character that any window called an entity is never left in clear.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

__all__ = [
    "IGNORED_LABELS",
    "TOKENS",
    "TokenScores",
    "aggregate",
    "aggregate_windows",
    "merge_overlapping",
    "redact",
    "redact_windows",
]

TOKENS: Final = "tokens"
"""Key of the runner's token-classify result holding its :class:`TokenScores` (not part of the
contract; reply building turns it into ``entities``)."""

IGNORED_LABELS: Final = ("O",)
"""Labels never reported (the pipeline's default ``ignore_labels``)."""


@dataclass(frozen=True, slots=True)
class TokenScores:
    """One text's per-token scores.

    Attributes:
        text: the text the offsets index (the request's text).
        scores: ``(n_tokens, n_labels)`` float32 softmax probabilities, special tokens
            included (they are skipped).
        labels: the model's ``id2label`` in id order.
        offsets / special / is_subword: per token, as
            :class:`consumer.batching.types.TokenAlignment`.
    """

    text: str
    scores: npt.NDArray[np.float32]
    labels: Sequence[str]
    offsets: Sequence[tuple[int, int]]
    special: Sequence[bool]
    is_subword: Sequence[bool]


@dataclass(slots=True)
class _Token:
    scores: npt.NDArray[np.float32]
    start: int
    end: int
    is_subword: bool


@dataclass(slots=True)
class _Labelled:
    label: str
    score: float
    start: int
    end: int


def _tag(label: str) -> tuple[str, str]:
    if label.startswith("B-"):
        return "B", label[2:]
    if label.startswith("I-"):
        return "I", label[2:]
    return "I", label


def _word(tokens: list[_Token], strategy: str, labels: Sequence[str]) -> _Labelled:
    if strategy == "first":
        scores = tokens[0].scores
    elif strategy == "max":
        scores = max(tokens, key=lambda t: float(t.scores.max())).scores
    else:  # average
        scores = np.nanmean(np.stack([t.scores for t in tokens]), axis=0)
    best = int(scores.argmax())
    return _Labelled(labels[best], float(scores[best]), tokens[0].start, tokens[-1].end)


def _words(tokens: list[_Token], strategy: str, labels: Sequence[str]) -> list[_Labelled]:
    out: list[_Labelled] = []
    group: list[_Token] = []
    for token in tokens:
        if group and not token.is_subword:
            out.append(_word(group, strategy, labels))
            group = []
        group.append(token)
    if group:
        out.append(_word(group, strategy, labels))
    return out


def _group(entities: list[_Labelled]) -> list[_Labelled]:
    groups: list[_Labelled] = []
    run: list[_Labelled] = []

    def close() -> None:
        label = run[0].label.split("-", 1)[-1]
        score = float(np.nanmean([e.score for e in run]))
        groups.append(_Labelled(label, score, run[0].start, run[-1].end))

    for entity in entities:
        if run:
            bi, tag = _tag(entity.label)
            _, last_tag = _tag(run[-1].label)
            if tag == last_tag and bi != "B":
                run.append(entity)
                continue
            close()
        run = [entity]
    if run:
        close()
    return groups


def aggregate(tokens: TokenScores, strategy: str = "simple") -> list[dict[str, Any]]:
    """The entities of ``tokens`` (see the module docstring), in text order, as contract maps
    ``{"label", "score", "start", "end", "text"}``.

    Raises:
        ValueError: an unknown ``strategy``.
    """
    if strategy not in ("none", "simple", "first", "max", "average"):
        raise ValueError(f"unknown aggregation {strategy!r}")
    labels = tokens.labels
    pre = [
        _Token(tokens.scores[i], start, end, tokens.is_subword[i])
        for i, (start, end) in enumerate(tokens.offsets)
        if not tokens.special[i]
    ]
    entities: list[_Labelled]
    if strategy in ("none", "simple"):
        entities = []
        for t in pre:
            best = int(t.scores.argmax())
            entities.append(_Labelled(labels[best], float(t.scores[best]), t.start, t.end))
    else:
        entities = _words(pre, strategy, labels)
    if strategy != "none":
        entities = _group(entities)
    text = tokens.text
    return [
        {
            "label": e.label,
            "score": e.score,
            "start": e.start,
            "end": e.end,
            "text": text[e.start : e.end],
        }
        for e in entities
        if e.label not in IGNORED_LABELS
    ]


def redact(text: str, entities: Sequence[dict[str, Any]]) -> str:
    """``text`` with each entity's ``[start, end)`` replaced by ``[LABEL]`` (entities in text
    order; an entity overlapping the previous one's span is skipped)."""
    parts: list[str] = []
    at = 0
    for e in sorted(entities, key=lambda e: (e["start"], e["end"])):
        start, end = int(e["start"]), int(e["end"])
        if start < at:
            continue
        parts.append(text[at:start])
        parts.append(f"[{e['label']}]")
        at = end
    parts.append(text[at:])
    return "".join(parts)


def merge_overlapping(entities: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """transformers' ``aggregate_overlapping_entities``: ``entities`` sorted by ``start``
    (stable); an entity starting inside the one kept before it replaces it when longer, or as
    long with a higher score, else is dropped."""
    if not entities:
        return []
    ordered = sorted(entities, key=lambda e: e["start"])
    kept: list[dict[str, Any]] = []
    previous = ordered[0]
    for entity in ordered:
        if previous["start"] <= entity["start"] < previous["end"]:
            length = entity["end"] - entity["start"]
            previous_length = previous["end"] - previous["start"]
            if length > previous_length or (
                length == previous_length and entity["score"] > previous["score"]
            ):
                previous = entity
        else:
            kept.append(previous)
            previous = entity
    kept.append(previous)
    return kept


def _window_entities(
    windows: Sequence[TokenScores], strategy: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(every window's entities, in window order; the merged entities)."""
    if len(windows) == 1:
        found = aggregate(windows[0], strategy)
        return found, found
    found = [e for w in windows for e in aggregate(w, strategy)]
    return found, merge_overlapping(found)


def aggregate_windows(
    windows: Sequence[TokenScores], strategy: str = "simple"
) -> list[dict[str, Any]]:
    """The entities of a text split into ``windows`` (in text order): each window's
    :func:`aggregate`, merged by :func:`merge_overlapping` when there are several — what
    ``pipeline("token-classification", aggregation_strategy=strategy, stride=…)`` returns
    (the pipeline refuses ``none`` with a stride; kbatch merges its tokens the same way).

    Raises:
        ValueError: an unknown ``strategy``.
    """
    return _window_entities(windows, strategy)[1]


def redact_windows(windows: Sequence[TokenScores], strategy: str = "simple") -> str:
    """The text with every character any window's entity covers replaced: each maximal run of
    overlapping entity spans (of all windows, before the merge) becomes one ``[LABEL]``, the
    label of the merged entity with the most characters in it (the first on a tie).

    For one window this is :func:`redact` of :func:`aggregate` (a window's entities do not
    overlap). ``windows`` index the same text.
    """
    found, kept = _window_entities(windows, strategy)
    text = windows[0].text
    runs: list[list[int]] = []
    for start, end in sorted((int(e["start"]), int(e["end"])) for e in found):
        if end <= start:
            continue
        if runs and start < runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], end)
        else:
            runs.append([start, end])
    parts: list[str] = []
    at = 0
    for start, end in runs:
        inside = [e for e in kept if e["start"] < end and start < e["end"]] or [
            e for e in found if e["start"] < end and start < e["end"]
        ]
        best = max(inside, key=lambda e: min(end, e["end"]) - max(start, e["start"]))
        parts += [text[at:start], f"[{best['label']}]"]
        at = end
    parts.append(text[at:])
    return "".join(parts)
