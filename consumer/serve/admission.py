"""Admission of one decoded request (pure): refused, expired, or computed under which key.

:func:`admit` takes the request, its record key, the served task and model profile and the
clocks, and returns a verdict; the pipeline executes it (the reply, the dedup decision, the
engine item). Order of the checks (CONTRACT.md §Errors): the task (``unsupported_task``),
the options of contract 1.1 and 1.2 (``invalid_option``), then the deadline (``expired``).
"""

from __future__ import annotations

from dataclasses import dataclass

from consumer.batching.types import ChunkPlan, InferenceItem, Lane
from consumer.options import (
    EmbedOptions,
    ModelProfile,
    OptionError,
    admit_options,
    dedup_key,
    prompted_text,
)
from consumer.replies.task_options import NEW_TASKS, check_task_options, window_rule
from consumer.serve.dedup import input_digest
from schemas.errors import ErrorCode
from schemas.models import Request

__all__ = ["Compute", "Expire", "Refuse", "Verdict", "admit"]


@dataclass(frozen=True, slots=True)
class Refuse:
    """Answer at once with an error reply; nothing is computed."""

    code: ErrorCode
    message: str


@dataclass(frozen=True, slots=True)
class Expire:
    """The request's deadline passed before it was read: answer ``expired``."""

    late_ms: int


@dataclass(slots=True)
class Compute:
    """Compute the request, or share the computation of a copy under the same ``dedup_key``
    (the dedup cache decides). Not frozen: one per computed record (the hot path)."""

    dedup_key: bytes
    """Copies share a computation when the model sees the same input: the record key and the
    prompt name, plus the window variant (:func:`consumer.options.dedup_key`)."""
    digest: bytes
    """The request's input (its text; rerank: query and documents) as
    :func:`consumer.serve.dedup.input_digest`: a copy under the same ``dedup_key`` with another
    digest is answered ``idempotency_key_reused`` (contract 1.4)."""
    text: str
    """What the model reads: the prompt before the text (with chunking: the raw text)."""
    deadline_s: float | None
    """The request's ``deadline_ms`` on the monotonic clock (seconds), else None."""
    windows: bool
    chunking: ChunkPlan | None

    def item(
        self,
        item_id: int,
        request: Request,
        group: object,
        lane: Lane,
        now: float,
        trace: object | None,
    ) -> InferenceItem:
        """The engine item of this computation."""
        return InferenceItem(
            item_id=item_id,
            text=self.text,
            truncate=request.truncate,
            arrival_s=now,
            deadline_s=self.deadline_s,
            group=group,
            documents=None if request.documents is None else tuple(request.documents),
            lane=lane,
            windows=self.windows,
            chunking=self.chunking,
            trace=trace,
        )


Verdict = Refuse | Expire | Compute


def admit(
    request: Request,
    key: bytes | None,
    task: str,
    profile: ModelProfile,
    now: float,
    now_ms: int,
) -> Verdict:
    """The verdict on ``request`` (see the module docstring).

    Args:
        request: the decoded request value.
        key: its record's key (None: no key).
        task: the task this consumer serves (``--task``).
        profile: the served model's profile (its task, prompts, dimensions).
        now: monotonic seconds (``InferenceItem.arrival_s``' clock).
        now_ms: Unix epoch milliseconds (the contract's ``deadline_ms`` clock).
    """
    if request.task is not None and request.task != task:
        return Refuse(
            ErrorCode.UNSUPPORTED_TASK, f"this consumer serves task {task!r}, not {request.task!r}"
        )
    prompt_name: str | None = None
    try:
        check_task_options(request, profile.task)  # contract 1.2 options, on any task
        if profile.task not in NEW_TASKS and (
            request.has_embed_options or profile.default_prompt_name is not None
        ):
            prompt_name = admit_options(EmbedOptions.of(request), profile)
    except OptionError as err:
        return Refuse(ErrorCode.INVALID_OPTION, str(err))
    if request.deadline_ms is not None and request.deadline_ms <= now_ms:
        return Expire(late_ms=now_ms - request.deadline_ms)
    # Copies share a computation when the model sees the same input: same key, same prompt;
    # their other options are shaped from it per copy (ReplyBuilder).
    chunking = request.chunking
    windows, variant = window_rule(profile.task, request.truncate, request.redact, chunking)
    name = prompt_name if variant is None else (prompt_name or "") + variant
    deadline_s = None
    if request.deadline_ms is not None:
        deadline_s = now + (request.deadline_ms - now_ms) / 1000
    plan = None
    if chunking is not None:  # contract 1.3: the prompt goes in front of every chunk
        plan = ChunkPlan(
            chunking.max_tokens, chunking.overlap, prompted_text("", prompt_name, profile)
        )
    text = request.text if plan else prompted_text(request.text, prompt_name, profile)
    digest = input_digest(request.text, request.documents)
    return Compute(dedup_key(key or b"", name), digest, text, deadline_s, windows, plan)
