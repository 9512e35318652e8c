"""Pure helpers of ``kbatch bench e2e``: throughput arithmetic, the latency-phase rate, the
ratios, the pre-filled request records, the table and the plot (no Kafka, no torch).

Figures (the definitions every variant shares; see :mod:`consumer.bench.e2e`):

- ``seq_per_s`` = N / ``drain_s``: requests answered per second while draining a backlog of N
  requests that all became readable at once.
- ``p50_ms`` / ``p99_ms``: percentiles of per-request latency in an open-loop run at
  ``latency_rate_per_s`` (:func:`latency_rate`), in milliseconds.
- ``ratio_a_vs_b`` = ``seq_per_s`` of ``a`` / ``seq_per_s`` of ``b``, rounded to 2 decimals
  (``None`` when either variant was not run).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from schemas import headers as H
from schemas.codec import Encoding, encode_request
from schemas.models import Request

__all__ = [
    "RATIOS",
    "VARIANTS",
    "latency_rate",
    "plot_e2e",
    "prefill_records",
    "print_e2e_table",
    "ratios",
    "seq_per_s",
]

VARIANTS: tuple[str, ...] = (
    "naive",
    "kbatch",
    "kbatch_onnx",
    "engine",
    "passthrough",
    "raw_loop",
)
"""Every variant, in report order."""

RATIOS: tuple[tuple[str, str, str], ...] = (
    ("ratio_kbatch_vs_naive", "kbatch", "naive"),
    ("ratio_kbatch_vs_engine", "kbatch", "engine"),
    ("ratio_kbatch_onnx_vs_kbatch", "kbatch_onnx", "kbatch"),
    ("ratio_kbatch_onnx_vs_naive", "kbatch_onnx", "naive"),
    ("ratio_passthrough_vs_raw", "passthrough", "raw_loop"),
)
"""(report key, numerator variant, denominator variant) of each throughput ratio."""

PrefillRecord = tuple[bytes, bytes, list[tuple[str, bytes]]]
"""(key, msgpack value, headers) of one pre-filled request record."""


def seq_per_s(n: int, drain_s: float) -> float:
    """``n / drain_s`` rounded to 0.1; raises ``ValueError`` unless ``n > 0`` and
    ``drain_s > 0`` (a drain that took no time was not measured)."""
    if n <= 0 or not drain_s > 0 or not math.isfinite(drain_s):
        raise ValueError(f"need n > 0 and a finite drain_s > 0, got n={n}, drain_s={drain_s}")
    return round(n / drain_s, 1)


def latency_rate(seq_per_s: float, fraction: float, cap_per_s: float | None) -> float:
    """The open-loop rate (requests/s) of a variant's latency phase: ``fraction`` of its
    measured throughput, at most ``cap_per_s`` (None: no cap), at least 0.5/s.

    Raises ``ValueError`` for a fraction outside (0, 1] or a cap that is not > 0.
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    if cap_per_s is not None and not cap_per_s > 0:
        raise ValueError(f"cap_per_s must be > 0, got {cap_per_s}")
    rate = fraction * seq_per_s
    if cap_per_s is not None:
        rate = min(rate, cap_per_s)
    return round(max(rate, 0.5), 1)


def ratios(report: Mapping[str, Any]) -> dict[str, float | None]:
    """The throughput ratios of :data:`RATIOS` from the variants' ``seq_per_s``."""
    out: dict[str, float | None] = {}
    for key, num, den in RATIOS:
        a, b = report.get(num), report.get(den)
        if isinstance(a, Mapping) and isinstance(b, Mapping) and b.get("seq_per_s"):
            out[key] = round(float(a["seq_per_s"]) / float(b["seq_per_s"]), 2)
        else:
            out[key] = None
    return out


def prefill_records(texts: Sequence[str], reply_topic: str, key_prefix: str) -> list[PrefillRecord]:
    """One contract request record per text, as a client would send it: key
    ``<key_prefix>-<index>`` (unique, so nothing is deduplicated), a msgpack value, headers
    ``kafka_replyTopic``, a random 16-byte ``kafka_correlationId`` and ``content-type``."""
    topic = reply_topic.encode()
    ctype = Encoding.MSGPACK.value.encode()
    out: list[PrefillRecord] = []
    for i, text in enumerate(texts):
        value = encode_request(Request(text=text), Encoding.MSGPACK)
        headers = [
            (H.REPLY_TOPIC, topic),
            (H.CORRELATION_ID, os.urandom(16)),
            (H.CONTENT_TYPE, ctype),
        ]
        out.append((f"{key_prefix}-{i}".encode(), value, headers))
    return out


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def print_e2e_table(report: Mapping[str, Any], console: Any) -> None:
    """A rich table of the variants, then the ratios and the setup (``console``: a rich
    ``Console``)."""
    from rich.table import Table

    table = Table(title="kbatch bench e2e")
    cols = ("seq_per_s", "p50_ms", "p99_ms", "latency_rate_per_s", "drain_s", "first_reply_ms")
    table.add_column("variant")
    for c in cols:
        table.add_column(c, justify="right")
    for name in VARIANTS:
        row = report.get(name)
        if isinstance(row, Mapping):
            table.add_row(name, *(_cell(row.get(c)) for c in cols))
    console.print(table)
    for key, _, _ in RATIOS:
        console.print(f"{key}: {_cell(report.get(key))}")
    if report.get("plots"):
        console.print(f"plots: {', '.join(report['plots'])}")
    console.print(f"setup: {report.get('setup')}")


def plot_e2e(report: Mapping[str, Any], out_dir: Path, name: str = "bench_e2e.png") -> Path:
    """One PNG, two panels: throughput (seq/s) and latency p50/p99 (ms) per variant, both on
    log scales; returns its path (``out_dir`` is created)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in VARIANTS if isinstance(report.get(n), Mapping)]
    rows = [report[n] for n in names]
    fig, (ax_t, ax_l) = plt.subplots(1, 2, figsize=(11, 4.2))
    tput = [float(r["seq_per_s"]) for r in rows]
    bars = ax_t.bar(names, tput, color=["#999999" if n != "kbatch" else "#1f77b4" for n in names])
    ax_t.bar_label(bars, labels=[f"{v:,.0f}" for v in tput], fontsize=8)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("seq/s (drain of a pre-filled topic)")
    ax_t.set_title("Throughput")
    xs = range(len(names))
    width = 0.38
    p50 = [float(r["p50_ms"]) if r.get("p50_ms") is not None else math.nan for r in rows]
    p99 = [float(r["p99_ms"]) if r.get("p99_ms") is not None else math.nan for r in rows]
    ax_l.bar([x - width / 2 for x in xs], p50, width, label="p50")
    ax_l.bar([x + width / 2 for x in xs], p99, width, label="p99")
    ax_l.set_xticks(list(xs), names)
    ax_l.set_yscale("log")
    ax_l.set_ylabel("ms (open loop)")
    frac = report.get("setup", {}).get("load_fraction")
    ax_l.set_title(f"Latency at {frac:g}× each variant's throughput" if frac else "Latency")
    ax_l.legend()
    for ax in (ax_t, ax_l):
        ax.tick_params(axis="x", labelrotation=15)
        ax.grid(axis="y", alpha=0.3, which="both")
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / name
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
