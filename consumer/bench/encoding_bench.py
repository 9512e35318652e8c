"""``kbatch bench encoding``: what each ``encoding_format`` costs per reply (contract 1.1).

Each reply goes through the serving path's own builder, :meth:`ReplyBuilder.from_outcome`:
options shaped from the runner's result (:func:`consumer.options.shape_result`), the fast
``reply_wire`` and the codec — so ``float`` is the list the runner already made, and
``f32le``/``f16le``/``binary`` normalise the pooled vector again in numpy and pack bytes. The
outcome imitates an embedder with a ``Normalize`` module (MiniLM): ``embedding`` the normalised
list, ``pooled`` the raw float32 vector.

Reported per dimension and format: ``bytes_per_reply`` (the encoded value), ``us_per_reply``
(best of ``rounds``: the least disturbed by other processes) and ``bytes_per_s`` (encoded bytes
produced per second of one core at that speed).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from consumer.batching.types import ItemOutcome
from consumer.options import ModelProfile
from consumer.replies.builder import ReplyBuilder
from schemas.codec import Encoding
from schemas.models import ENCODING_FORMATS, ModelInfo, Request
from schemas.records import ParsedRequest, ReplyAddress

__all__ = ["run_encoding_bench"]


def _outcome(dim: int, seed: int) -> ItemOutcome:
    pooled = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    normalised = pooled / np.linalg.norm(pooled)
    return ItemOutcome(
        item_id=0,
        status="ok",
        result={"embedding": normalised.tolist(), "dim": dim, "pooled": pooled},
        error_code=None,
        error_message=None,
        truncated=False,
        n_tokens=42,
        queue_ms=1.25,
        infer_ms=3.5,
        batch_size=32,
        padded_len=64,
    )


def _measure(
    builder: ReplyBuilder, parsed: ParsedRequest, outcome: ItemOutcome, n: int, rounds: int
) -> tuple[int, float]:
    """Encoded bytes of one reply and the best per-reply time in µs over ``rounds`` of ``n``."""
    size = len(builder.from_outcome(parsed, outcome, dedup=False).value or b"")
    best_s = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            builder.from_outcome(parsed, outcome, dedup=False)
        best_s = min(best_s, (time.perf_counter() - start) / n)
    return size, best_s * 1e6


def run_encoding_bench(
    dims: tuple[int, ...] = (384, 1024),
    encodings: tuple[Encoding, ...] = (Encoding.MSGPACK, Encoding.JSON),
    n: int = 2000,
    rounds: int = 5,
) -> dict[str, Any]:
    """The report: ``{encoding: {str(dim): {format: {bytes_per_reply, us_per_reply,
    bytes_per_s, replies_per_s}}}}`` plus the parameters."""
    builder = ReplyBuilder(ModelInfo(name="bench", revision="1"), "dlq", ModelProfile())
    builder.profile = ModelProfile(dim=max(dims), normalizes=True)
    report: dict[str, Any] = {"n": n, "rounds": rounds, "dims": list(dims)}
    for encoding in encodings:
        by_dim: dict[str, Any] = {}
        for dim in dims:
            outcome = _outcome(dim, seed=dim)
            rows: dict[str, Any] = {}
            for fmt in ENCODING_FORMATS:
                request = Request(text="x", encoding_format=None if fmt == "float" else fmt)
                parsed = ParsedRequest(b"key-0001", request, ReplyAddress(), encoding)
                size, us = _measure(builder, parsed, outcome, n, rounds)
                rows[fmt] = {
                    "bytes_per_reply": size,
                    "us_per_reply": round(us, 2),
                    "replies_per_s": round(1e6 / us),
                    "bytes_per_s": round(size * 1e6 / us),
                }
            by_dim[str(dim)] = rows
        report["msgpack" if encoding is Encoding.MSGPACK else "json"] = by_dim
    return report
