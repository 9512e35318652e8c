"""A simulated accelerator: ``--model sim:FIXED_MS,US_PER_TOKEN[,DIM]``.

:class:`SimBackend` is a :class:`~consumer.model.protocol.ModelBackend` whose ``forward`` holds
the model thread for ``FIXED_MS + US_PER_TOKEN × padded tokens`` (``time.sleep`` releases the
GIL, as a CUDA call does while the kernel runs) and answers deterministic unit vectors. It lets
``kbatch serve`` and ``kbatch bench e2e`` be planned against a GPU this machine does not have:
the CPU side (Kafka, decode, tokenizer, buckets, replies) is real, only the device is simulated.

The tokenizer is MiniLM's real one (:func:`consumer.model.loader.load_model` pairs them): the
padded token counts the cost model charges for are then the ones the real model would see, and
the CPU cost per record includes real tokenization (on a GPU host it is part of what the cores
must keep up with). Calibrations for MiniLM on an H200 and an L4: BENCHMARKS.md §Simulated
device.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from consumer.batching.types import TokenizedItem
from consumer.model.protocol import Task

__all__ = ["SIM_PREFIX", "SimBackend", "SimSpec", "parse_sim"]

SIM_PREFIX = "sim:"
"""``--model`` values starting with this name a simulated device (:func:`parse_sim`)."""

DEFAULT_DIM = 384
"""all-MiniLM-L6-v2's embedding dimension."""

_TABLE_SIZE = 256
"""Distinct answer vectors (picked by a hash of the item's token ids)."""


@dataclass(frozen=True)
class SimSpec:
    """The cost model of one simulated device.

    Attributes:
        fixed_ms: milliseconds of every forward whatever its size (kernel launches, host↔device
            copies, synchronisation), ≥ 0.
        us_per_token: microseconds per padded token (batch size × padded length), ≥ 0.
        dim: embedding dimension of the answers, ≥ 1.
    """

    fixed_ms: float
    us_per_token: float
    dim: int = DEFAULT_DIM

    def forward_s(self, padded_tokens: int) -> float:
        """Seconds one forward of ``padded_tokens`` (batch size × padded length) holds the
        device: ``fixed_ms / 1e3 + us_per_token × padded_tokens / 1e6``."""
        return self.fixed_ms / 1e3 + self.us_per_token * padded_tokens / 1e6


def parse_sim(model: str) -> SimSpec | None:
    """``sim:FIXED_MS,US_PER_TOKEN[,DIM]`` → its :class:`SimSpec`; None when ``model`` does not
    start with ``sim:``.

    Raises:
        ValueError: the spec is malformed (two or three numbers, non-negative, DIM ≥ 1).
    """
    if not model.startswith(SIM_PREFIX):
        return None
    parts = [p.strip() for p in model[len(SIM_PREFIX) :].split(",")]
    usage = f"--model {model}: expected sim:FIXED_MS,US_PER_TOKEN[,DIM] (e.g. sim:0.3,0.05)"
    if len(parts) not in (2, 3):
        raise ValueError(usage)
    try:
        fixed_ms, us_per_token = float(parts[0]), float(parts[1])
        dim = int(parts[2]) if len(parts) == 3 else DEFAULT_DIM
    except ValueError as err:
        raise ValueError(usage) from err
    if not (fixed_ms >= 0 and us_per_token >= 0 and dim >= 1) or math.inf in (
        fixed_ms,
        us_per_token,
    ):
        raise ValueError(usage)
    return SimSpec(fixed_ms, us_per_token, dim)


def _unit_vector(seed: int, dim: int) -> list[float]:
    raw = hashlib.blake2b(seed.to_bytes(4, "big"), digest_size=64).digest()
    values = [((raw[i % 64] + 31 * i) % 251) / 125.0 - 1.0 + 1e-3 for i in range(dim)]
    norm = math.sqrt(sum(v * v for v in values))
    return [v / norm for v in values]


class SimBackend:
    """A :class:`~consumer.model.protocol.ModelBackend` that sleeps like a device.

    ``forward`` of ``n`` items padded to ``L`` tokens calls ``sleep(spec.forward_s(n × L))`` and
    answers each item a unit vector of ``spec.dim`` float values chosen by its token ids (the
    same ids, the same vector; never dependent on the batch). Embed only.

    Args:
        spec: the cost model.
        max_length: maximum tokens per item (the tokenizer's cap).
        sleep: the sleep function (seconds); tests pass a fake that records.

    Attributes:
        busy_s: total seconds slept in ``forward`` (the simulated device's busy time).
        batches: forwards run.
    """

    def __init__(
        self,
        spec: SimSpec,
        max_length: int,
        *,
        task: Task = "embed",
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if task != "embed":
            raise ValueError("a simulated device computes embeddings only (--task embed)")
        self.spec = spec
        self.task: Task = task
        self.max_length = max_length
        self.prefetch = False
        self.name = f"sim:{spec.fixed_ms:g},{spec.us_per_token:g},{spec.dim}"
        self.revision: str | None = None
        self.embedding_dim: int | None = spec.dim
        self.normalizes = True
        self._sleep = sleep
        self._table = [_unit_vector(i, spec.dim) for i in range(_TABLE_SIZE)]
        self.busy_s = 0.0
        self.batches = 0

    def prepare(self, items: Sequence[TokenizedItem], padded_len: int) -> object:
        """``(token ids per item, padded_len)``; raises ``ValueError`` when an item is longer."""
        if any(t.n_tokens > padded_len for t in items):
            raise ValueError("an item is longer than padded_len")
        return ([t.input_ids for t in items], padded_len)

    def forward(self, prepared: object) -> list[dict[str, Any]]:
        """Sleep for the batch's simulated device time, then answer every item."""
        if not isinstance(prepared, tuple):
            raise TypeError("forward() takes the result of prepare()")
        ids: list[Sequence[int]] = prepared[0]
        padded_len: int = prepared[1]
        seconds = self.spec.forward_s(len(ids) * padded_len)
        self._sleep(seconds)
        self.busy_s += seconds
        self.batches += 1
        table, size = self._table, _TABLE_SIZE
        out = []
        for row in ids:
            vec = table[hash(tuple(row)) % size]
            out.append({"embedding": vec, "dim": self.spec.dim, "pooled": vec})
        return out

    def warmup(self, batch_size: int, seq_len: int) -> None:
        """Nothing to build: a simulated device has no kernels or memory to check."""

    def is_oom(self, exc: BaseException) -> bool:
        """Never: a simulated device has no memory limit."""
        return False

    def recover(self, exc: BaseException) -> None:
        """Nothing to clean up."""
