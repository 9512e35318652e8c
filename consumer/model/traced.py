"""The torch backend's traced network: the same transformers model run as a TorchScript graph.

Eager torch runs a MiniLM batch as ~750 Python-dispatched ops; ``torch.jit.trace`` records
them once, and the traced module runs the graph in TorchScript's C++ interpreter, without the
per-op Python dispatch. Measured in-process (BENCHMARKS.md §Latency under load):
a MiniLM batch of 8 × 32 is ~15–20 % faster traced on 2 CPU threads (a full 32 × 64 batch a
few per cent: the per-op Python cost is fixed per batch), with the same outputs (max
difference 0.0 on every shape tried). The GIL is not what the trace saves: next to a thread
running Python half the time, the forward slows as much as next to a *process* doing the same
(CPU contention, not GIL hand-offs, at kbatch's 0.5 ms switch interval).

The trace is dynamic in the batch and sequence sizes (they are read from the input tensors'
``size()`` in the recorded graph: one trace serves every bucket), and it is recorded with a
padded example so the attention mask's path is in the graph. :func:`trace_network` checks the
trace against the eager model on a second shape before handing it out and returns ``None``
(eager stays) on any failure, logged once.

Scope: ``embed`` (``last_hidden_state``) and ``classify`` (``logits``) on the CPU in float32
(:class:`~consumer.model.torch_backend.TorchBackend` uses the trace only for batches that run
without autocast). CUDA and contract 1.2's tasks stay eager: not measured yet.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable

import torch

from consumer.model.protocol import Task

__all__ = ["PARITY_ATOL", "TracedNetwork", "trace_network"]

log = logging.getLogger(__name__)

PARITY_ATOL = 1e-5
"""The largest difference :func:`trace_network` accepts between the traced and the eager
outputs on its check batch (absolute, on hidden states or logits, masked positions only)."""

TracedNetwork = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``(input_ids (n, L) int64, attention_mask (n, L) int64)`` → ``last_hidden_state``
``(n, L, H)`` (embed) or ``logits`` ``(n, C)`` (classify), in the model's dtype."""


class _Head(torch.nn.Module):
    """The model called with ids and mask, returning the one tensor the backend reads."""

    def __init__(self, model: torch.nn.Module, task: Task) -> None:
        super().__init__()
        self.model = model
        self.field = "last_hidden_state" if task == "embed" else "logits"

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask)
        return getattr(out, self.field)  # type: ignore[no-any-return]


def _example(n: int, length: int, token_id: int, pad_id: int) -> tuple[torch.Tensor, ...]:
    """``(n, length)`` ids of ``token_id`` and a mask whose odd rows are padded after a third
    of ``length`` (so the recorded graph applies the mask)."""
    ids = torch.full((n, length), token_id, dtype=torch.int64)
    mask = torch.ones((n, length), dtype=torch.int64)
    mask[1::2, max(1, length // 3) :] = 0
    ids[mask == 0] = pad_id
    return ids, mask


def _max_masked_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    if a.shape != b.shape:
        return float("inf")
    if a.dim() == 3:  # hidden states: padded positions carry no meaning
        keep = mask.unsqueeze(-1).to(a.dtype)
        a, b = a * keep, b * keep
    return float((a.float() - b.float()).abs().max())


def trace_network(
    model: torch.nn.Module, task: Task, *, token_id: int, pad_id: int
) -> TracedNetwork | None:
    """``model`` traced for ``task`` (``embed`` or ``classify``), or ``None`` when tracing
    fails or the trace differs from the eager model by more than :data:`PARITY_ATOL` on a
    check batch of another shape (a warning names why; the caller runs eager).

    Args:
        model: an eval-mode transformers model on the CPU (float32).
        token_id / pad_id: ids of the model's vocabulary for the example batches.

    The traced module shares ``model``'s parameters (no copy of the weights).
    """
    head = _Head(model, task).eval()
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TracerWarnings on shape arithmetic (dynamic)
            example = _example(2, 8, token_id, pad_id)
            traced = torch.jit.trace(head, example, check_trace=False)  # type: ignore[no-untyped-call]
            ids, mask = _example(3, 13, token_id, pad_id)
            ids[0, 2] = pad_id  # a pad id inside a real row, as a tokenizer may give
            diff = _max_masked_diff(traced(ids, mask), head(ids, mask), mask)
    except Exception as exc:  # any failure means: run eager
        log.warning("torch trace failed (%s: %s): the model runs eager", type(exc).__name__, exc)
        return None
    if not diff <= PARITY_ATOL:
        log.warning("torch trace differs from eager by %.3g: the model runs eager", diff)
        return None
    log.info("%s runs as a TorchScript trace (check batch: max difference %.3g)", task, diff)
    return traced  # type: ignore[no-any-return]
