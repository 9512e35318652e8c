"""The quality gate: how far a backend/precision answers from torch fp32, and when that is too far.

Used twice:

- at ``kbatch serve``/``kbatch backfill`` start-up (:func:`probe_gate`, from
  :func:`consumer.model.loader.load_model`) on :data:`PROBE_TEXTS`, whenever the model does not
  run as torch fp32 (``--backend onnx``, ``--quantize int8``, ``--dtype bfloat16``): the
  reference is the same model in torch fp32, loaded for the check and dropped after it;
- by ``kbatch bench quality`` on the VADER texts (:mod:`consumer.bench.quality`).

Figures (:class:`QualityReport`), per text, candidate against reference:

- embed: cosine of the two embeddings → ``min_cosine``, ``mean_cosine``;
- classify: cosine of the two score vectors (label order of ``config.id2label``), the share of
  texts whose top label agrees (``label_agreement``) and the largest ``|Δscore|`` of any label
  (``max_abs_delta_score``).

The rule (:func:`check_gate`): refused unless ``min_cosine`` ≥ 0.999 for a
full-precision path (fp32 ONNX) or ≥ 0.99 for a reduced one (int8, bf16/fp16), and, for
classify, every top label agrees; ``--allow-lossy`` turns the refusal into a warning.

Texts are scored in **mixed-length batches** (:func:`score_texts`: consecutive texts, padded to
the longest of each batch), because an export that mishandles padding still answers single
texts right.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from consumer.batching.protocols import BatchRunner, TokenizerLike
from consumer.batching.types import Batch, InferenceItem, TokenizedItem
from consumer.model.errors import LossyBackendError

__all__ = [
    "PROBE_TEXTS",
    "QualityReport",
    "check_gate",
    "compare_results",
    "min_cosine_required",
    "probe_gate",
    "score_texts",
]

log = logging.getLogger(__name__)

PROBE_TEXTS: tuple[str, ...] = (
    "ok",
    "The service was fine.",
    "I absolutely loved this movie, the acting was superb and the ending made me cry!",
    "Worst purchase ever. Broke after two days :(",
    "meh",
    "The committee met on Tuesday to discuss the budget for the coming fiscal year, and after "
    "a long debate about infrastructure spending, education and public health, it agreed to "
    "postpone the final vote until the auditors had reviewed the revenue projections.",
    "Not bad, not great either.",
    "Kafka consumers commit offsets after the replies are acknowledged.",
    "WOW!!! This is SO good 😍😍",
    "The package arrived late, the box was damaged, and customer support never answered my "
    "emails; I would not order from this shop again.",
    "Sentence embeddings map text to vectors.",
    "no",
    "An ordinary Tuesday.",
    "She said the results, while preliminary, were consistent with the earlier trials and "
    "justified a larger study across several hospitals.",
    "Great value for the price.",
    "Why?",
)
"""The start-up probe set: 16 fixed texts of 1 to ~50 tokens, in an order that mixes lengths."""

PROBE_BATCH_SIZE = 8
"""Texts per batch in :func:`score_texts` (mixed lengths in each)."""


@dataclass(frozen=True)
class QualityReport:
    """Candidate against reference on ``n`` texts (see the module docstring).

    ``label_agreement`` and ``max_abs_delta_score`` are None for embed models.
    """

    n: int
    min_cosine: float
    mean_cosine: float
    label_agreement: float | None = None
    max_abs_delta_score: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-able, rounded to 6 decimals."""
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in asdict(self).items()}


def _vector(result: Mapping[str, Any]) -> np.ndarray[Any, np.dtype[np.float64]]:
    if "embedding" in result:
        return np.asarray(result["embedding"], dtype=np.float64)
    scores = result["scores"]
    return np.asarray([scores[k] for k in sorted(scores)], dtype=np.float64)


def _cosine(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return 1.0 if na == nb else 0.0
    return float(np.dot(a, b) / (na * nb))


def compare_results(
    reference: Sequence[Mapping[str, Any] | None], candidate: Sequence[Mapping[str, Any] | None]
) -> QualityReport:
    """Compare two aligned lists of contract ``result`` maps (embed: ``embedding``; classify:
    ``label`` and ``scores``). A text either side failed on (None) counts as cosine 0.

    Raises ``ValueError`` when the lists differ in length or are empty.
    """
    if len(reference) != len(candidate) or not reference:
        raise ValueError(f"need two equal, non-empty lists ({len(reference)}, {len(candidate)})")
    cosines: list[float] = []
    agree = 0
    delta = 0.0
    classify = False
    for ref, cand in zip(reference, candidate, strict=True):
        if ref is None or cand is None:
            cosines.append(0.0)
            continue
        a, b = _vector(ref), _vector(cand)
        cosines.append(_cosine(a, b) if a.shape == b.shape else 0.0)
        if "label" in ref:
            classify = True
            agree += ref["label"] == cand.get("label")
            gap = float(np.max(np.abs(a - b))) if a.shape == b.shape else math.inf
            delta = max(delta, gap)
    return QualityReport(
        n=len(cosines),
        min_cosine=min(cosines),
        mean_cosine=float(np.mean(cosines)),
        label_agreement=agree / len(cosines) if classify else None,
        max_abs_delta_score=delta if classify else None,
    )


def min_cosine_required(reduced_precision: bool) -> float:
    """The gate's threshold: 0.99 for int8/bf16/fp16, 0.999 for a full-precision path."""
    return 0.99 if reduced_precision else 0.999


def check_gate(
    report: QualityReport, *, what: str, reduced_precision: bool, allow_lossy: bool
) -> None:
    """Apply the rule of the module docstring to ``report`` for the path named ``what``.

    Raises:
        LossyBackendError: the path fails the rule and ``allow_lossy`` is false (with
            ``allow_lossy`` the failure is logged as a warning).
    """
    need = min_cosine_required(reduced_precision)
    problems: list[str] = []
    if not report.min_cosine >= need:
        problems.append(f"min cosine {report.min_cosine:.6f} < {need}")
    if report.label_agreement is not None and report.label_agreement < 1.0:
        problems.append(f"label agreement {report.label_agreement:.3f} < 1")
    if not problems:
        log.info("quality gate passed for %s: %s", what, report.as_dict())
        return
    msg = f"{what} answers too far from torch fp32 on {report.n} probe texts: {'; '.join(problems)}"
    if allow_lossy:
        log.warning("%s (served anyway: --allow-lossy)", msg)
        return
    raise LossyBackendError(f"{msg}. Use --allow-lossy to serve it anyway.")


def score_texts(
    runner: BatchRunner,
    tokenizer: TokenizerLike,
    texts: Sequence[str],
    batch_size: int = PROBE_BATCH_SIZE,
) -> list[dict[str, Any] | None]:
    """Score ``texts`` with ``runner`` in batches of ``batch_size`` consecutive texts, each
    padded to its longest (mixed lengths); one ``result`` map per text (None when the text
    was rejected or failed). Over-length texts are truncated."""
    items = [InferenceItem(i, t, True, 0.0) for i, t in enumerate(texts)]
    tokenized = [t for t in tokenizer.tokenize(items) if isinstance(t, TokenizedItem)]
    out: list[dict[str, Any] | None] = [None] * len(texts)
    for start in range(0, len(tokenized), batch_size):
        chunk = tokenized[start : start + batch_size]
        batch = Batch(chunk, max(t.n_tokens for t in chunk), 0.0)
        for t, run in zip(chunk, runner.run(batch), strict=True):
            out[t.item.item_id] = dict(run.result) if run.result is not None else None
    return out


def probe_gate(
    candidate: BatchRunner,
    reference: BatchRunner,
    tokenizer: TokenizerLike,
    *,
    what: str,
    reduced_precision: bool,
    allow_lossy: bool,
) -> QualityReport:
    """The start-up gate: score :data:`PROBE_TEXTS` with both runners, compare, and apply
    :func:`check_gate`. Returns the report.

    Raises:
        LossyBackendError: see :func:`check_gate`.
    """
    ref = score_texts(reference, tokenizer, PROBE_TEXTS)
    cand = score_texts(candidate, tokenizer, PROBE_TEXTS)
    report = compare_results(ref, cand)
    check_gate(report, what=what, reduced_precision=reduced_precision, allow_lossy=allow_lossy)
    return report
