"""Pure helpers of ``kbatch bench e2e``: throughput arithmetic, the latency-phase rate, the
ratios, the pre-filled request records, the table and the plot (no Kafka, no torch).

Figures (the definitions every variant shares; see :mod:`consumer.bench.e2e`):

- ``seq_per_s`` = N / ``drain_s``: requests answered per second while draining a backlog of N
  requests that all became readable at once.
- ``p50_ms`` / ``p99_ms``: percentiles of per-request latency in an open-loop run at
  ``latency_rate_per_s`` (:func:`latency_rate`), in milliseconds.
- ``ratio_a_vs_b`` = ``seq_per_s`` of ``a`` / ``seq_per_s`` of ``b``, rounded to 2 decimals
  (``None`` when either variant was not run).
- ``--replicas 1,2``: ``kbatch`` and ``passthrough`` run once per replica count; the report
  key of N > 1 replicas is ``<variant>_x<N>`` (:func:`variant_key`) and
  ``ratio_<variant>_x<N>_vs_x1`` compares it with one replica of the same run.
- ``cpu_ratio_a_vs_b`` (:func:`cpu_ratios`): per ``--latency-rates`` point (``"1000/s"``), the
  ``cpu_ms_per_request`` of ``a`` / that of ``b`` (:func:`frontier_row`), rounded to 2
  decimals: kbatch against each raw tokenize loop (aiokafka, confluent-kafka), and the two
  loops against each other; None at a point where either side timed requests out.
- CPU and device figures (:func:`cpu_device_figures`), over the throughput drain:
  ``cpu_s`` (user + system seconds of the consumer's processes), ``cpu_cores_busy``
  (``cpu_s / drain_s``), ``cpu_us_per_record`` (``cpu_s × 1e6 / N``: what one record costs a
  replica); with a model time (``kbatch_inference_seconds_sum``, the simulated device's sleep):
  ``device_busy_fraction`` (model seconds / (replicas × ``drain_s``): each replica drives its
  own device), ``device_seq_per_s`` (N / model seconds: what a device answers when never
  idle, for the batches that formed) and ``cores_per_device`` (``device_seq_per_s ×
  cpu_us_per_record / 1e6``: the cores that keep one such device busy).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from schemas import headers as H
from schemas.codec import Encoding, encode_request
from schemas.models import Request

__all__ = [
    "CPU_RATIOS",
    "RATIOS",
    "VARIANTS",
    "cpu_device_figures",
    "cpu_ratios",
    "frontier_points",
    "frontier_row",
    "latency_rate",
    "plot_e2e",
    "plot_frontier",
    "prefill_records",
    "print_e2e_table",
    "ratios",
    "replica_ratios",
    "seq_per_s",
    "variant_key",
]

REPLICATED: tuple[str, ...] = ("kbatch", "passthrough")
"""The variants ``--replicas`` applies to (``kbatch serve`` processes)."""

TRACED: dict[str, float] = {"passthrough_trace1": 0.01, "passthrough_trace100": 1.0}
"""``passthrough`` under ``--tracing`` at this head-sampling ratio
(``OTEL_TRACES_SAMPLER=parentbased_traceidratio``), exporting to a discarding OTLP/HTTP
endpoint in the bench process (what tracing costs)."""

SERVED: tuple[str, ...] = (
    "kbatch",
    "kbatch_confluent",
    "kbatch_eos",
    "kbatch_eos_confluent",
    "kbatch_onnx",
    "kbatch_bf16",
    "passthrough",
    "passthrough_confluent",
    *TRACED,
)
"""The variants that run a ``kbatch serve`` process (all but ``kbatch`` and ``passthrough``
at one replica only)."""

VARIANTS: tuple[str, ...] = (
    "naive",
    "kbatch",
    "kbatch_confluent",
    "kbatch_eos",
    "kbatch_eos_confluent",
    "kbatch_onnx",
    "kbatch_bf16",
    "engine",
    "passthrough",
    "passthrough_confluent",
    "passthrough_trace1",
    "passthrough_trace100",
    "raw_loop",
    "raw_tokenize",
    "raw_tokenize_confluent",
)
"""Every variant, in report order."""

RATIOS: tuple[tuple[str, str, str], ...] = (
    ("ratio_kbatch_vs_naive", "kbatch", "naive"),
    ("ratio_kbatch_vs_engine", "kbatch", "engine"),
    ("ratio_kbatch_confluent_vs_kbatch", "kbatch_confluent", "kbatch"),
    ("ratio_kbatch_eos_vs_kbatch", "kbatch_eos", "kbatch"),
    ("ratio_kbatch_eos_confluent_vs_kbatch_eos", "kbatch_eos_confluent", "kbatch_eos"),
    ("ratio_kbatch_onnx_vs_kbatch", "kbatch_onnx", "kbatch"),
    ("ratio_kbatch_onnx_vs_naive", "kbatch_onnx", "naive"),
    ("ratio_kbatch_bf16_vs_kbatch", "kbatch_bf16", "kbatch"),
    ("ratio_passthrough_vs_raw", "passthrough", "raw_loop"),
    ("ratio_passthrough_confluent_vs_passthrough", "passthrough_confluent", "passthrough"),
    ("ratio_passthrough_trace1_vs_passthrough", "passthrough_trace1", "passthrough"),
    ("ratio_passthrough_trace100_vs_passthrough", "passthrough_trace100", "passthrough"),
)
"""(report key, numerator variant, denominator variant) of each throughput ratio."""

CPU_RATIOS: tuple[tuple[str, str, str], ...] = (
    ("cpu_ratio_kbatch_vs_raw_tokenize", "kbatch", "raw_tokenize"),
    ("cpu_ratio_kbatch_vs_raw_tokenize_confluent", "kbatch", "raw_tokenize_confluent"),
    ("cpu_ratio_raw_tokenize_vs_raw_tokenize_confluent", "raw_tokenize", "raw_tokenize_confluent"),
    (
        "cpu_ratio_kbatch_confluent_vs_raw_tokenize_confluent",
        "kbatch_confluent",
        "raw_tokenize_confluent",
    ),
    ("cpu_ratio_kbatch_confluent_vs_kbatch", "kbatch_confluent", "kbatch"),
)
"""(report key, numerator variant, denominator variant) of each host-CPU ratio
(:func:`cpu_ratios`): kbatch's CPU per request against each raw loop, and the aiokafka loop's
against the confluent-kafka one (the Kafka client's share), and kbatch on confluent-kafka
against that loop and against kbatch on aiokafka."""

PrefillRecord = tuple[bytes, bytes, list[tuple[str, bytes]]]
"""(key, msgpack value, headers) of one pre-filled request record."""


def token_stats(counts: Iterable[int]) -> dict[str, int]:
    """``median_tokens`` and ``p99_tokens`` (nearest rank) of the texts' token ``counts``
    (special tokens included): a report's ``setup``."""
    lengths = sorted(counts)
    return {
        "median_tokens": lengths[len(lengths) // 2],
        "p99_tokens": lengths[min(len(lengths) - 1, round(0.99 * (len(lengths) - 1)))],
    }


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


class _FrontierOptions(Protocol):
    @property
    def latency_fractions(self) -> tuple[float, ...]: ...
    @property
    def latency_rates(self) -> tuple[float, ...]: ...
    @property
    def max_latency_rate_per_s(self) -> float | None: ...


def frontier_points(seq_per_s: float, opts: _FrontierOptions) -> list[tuple[str, float]]:
    """The extra open-loop phases of one variant: ``(label, rate_per_s)``, each fraction of
    its own drain rate ``seq_per_s`` (label ``"0.7x"``, capped as :func:`latency_rate`), then
    each absolute rate (label ``"85/s"``, uncapped: the caller chose it), in the order given.
    """
    points = [
        (f"{f:g}x", latency_rate(seq_per_s, f, opts.max_latency_rate_per_s))
        for f in opts.latency_fractions
    ]
    points += [(f"{r:g}/s", round(r, 1)) for r in opts.latency_rates]
    return points


def frontier_row(
    label: str,
    rate_per_s: float,
    summary: Mapping[str, Any],
    cpu_s: float | None = None,
    sent: int | None = None,
) -> dict[str, Any]:
    """One frontier point of a Kafka variant from its load summary
    (:func:`producer_tools.report.window_stats`); with the consumer processes' CPU seconds
    over the whole phase (``cpu_s``) and the requests sent in it (``sent``, warm-up and probe
    included), ``cpu_ms_per_request`` = ``cpu_s × 1000 / sent``: the host path's cost per
    request at that offered rate (``kbatch bench e2e --latency-rates``)."""
    lat = summary["latency_ms"]
    per_request = None if cpu_s is None or not sent else round(cpu_s * 1000.0 / sent, 3)
    return {
        "point": label,
        "rate_per_s": rate_per_s,
        "p50_ms": lat["p50"],
        "p99_ms": lat["p99"],
        "requests": summary["scheduled"],
        "timeouts": summary["timeouts"],
        "send_lag_ms_p99": summary["send_lag_ms"]["p99"],
        "batch_size_mean": summary["batch_size_mean"],
        "stages_ms": summary.get("stages_ms"),
        "cpu_s": None if cpu_s is None else round(cpu_s, 3),
        "cpu_ms_per_request": per_request,
    }


def with_thread_shares(
    row: dict[str, Any],
    before: Mapping[str, float] | None,
    after: Mapping[str, float] | None,
) -> dict[str, Any]:
    """``row`` (a :func:`frontier_row`) with ``cpu_ms_per_request_by_thread``: its
    ``cpu_ms_per_request`` split by thread role in the proportions of
    ``kbatch_thread_cpu_seconds_total`` between the two readings (``before``, ``after``: seconds
    by role). The counter moves once a second, so its shares, not its seconds, are used: the
    phase's total stays the one measured from the process. None without both readings."""
    per_request = row.get("cpu_ms_per_request")
    if before is None or after is None or per_request is None:
        return {**row, "cpu_ms_per_request_by_thread": None}
    spent = {role: after[role] - before.get(role, 0.0) for role in after}
    total = sum(v for v in spent.values() if v > 0)
    if total <= 0:
        return {**row, "cpu_ms_per_request_by_thread": None}
    by_thread = {
        role: round(per_request * v / total, 3)
        for role, v in sorted(spent.items(), key=lambda kv: -kv[1])
        if v > 0
    }
    return {**row, "cpu_ms_per_request_by_thread": by_thread}


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


def cpu_ratios(report: Mapping[str, Any]) -> dict[str, dict[str, float | None] | None]:
    """The host-CPU ratios of :data:`CPU_RATIOS` at the absolute-rate frontier points
    (``--latency-rates``): for each pair, ``{point label: numerator's cpu_ms_per_request /
    denominator's}`` rounded to 2 decimals, over the labels both variants measured (``"100/s"``
    …); a point either side lacks a figure for, or timed requests out at, is None (a request
    never answered did not cost its full CPU: the quotient would flatter that side). A pair is
    None when either variant was not run or neither has such a point."""
    out: dict[str, dict[str, float | None] | None] = {}
    for key, num, den in CPU_RATIOS:
        a, b = _rate_points(report.get(num)), _rate_points(report.get(den))
        labels = [label for label in a if label in b]
        if not labels:
            out[key] = None
            continue
        points: dict[str, float | None] = {}
        for label in labels:
            x, y = a[label], b[label]
            points[label] = None if x is None or y is None else round(x / y, 2)
        out[key] = points
    return out


def _rate_points(row: Any) -> dict[str, float | None]:
    """``{label: cpu_ms_per_request}`` of a variant's absolute-rate frontier points (labels
    ending in ``/s``), None where the figure is missing, zero or the point timed requests out;
    empty for a variant not run."""
    if not isinstance(row, Mapping):
        return {}
    out: dict[str, float | None] = {}
    for p in row.get("frontier") or ():
        if not str(p.get("point", "")).endswith("/s"):
            continue
        cpu_ms = p.get("cpu_ms_per_request")
        out[p["point"]] = cpu_ms if cpu_ms and not p.get("timeouts") else None
    return out


def variant_key(name: str, replicas: int) -> str:
    """The report key of variant ``name`` run with ``replicas`` processes: ``name`` for one,
    ``<name>_x<replicas>`` for more."""
    return name if replicas == 1 else f"{name}_x{replicas}"


def replica_ratios(report: Mapping[str, Any], replicas: Sequence[int]) -> dict[str, float | None]:
    """``ratio_<v>_x<N>_vs_x1`` for each replicated variant ``v`` and each N > 1 in
    ``replicas``: ``seq_per_s`` with N replicas / with one (None when a side is missing)."""
    out: dict[str, float | None] = {}
    for name in REPLICATED:
        one = report.get(name)
        for n in replicas:
            if n == 1:
                continue
            many = report.get(variant_key(name, n))
            key = f"ratio_{variant_key(name, n)}_vs_x1"
            if isinstance(one, Mapping) and isinstance(many, Mapping) and one.get("seq_per_s"):
                out[key] = round(float(many["seq_per_s"]) / float(one["seq_per_s"]), 2)
            elif isinstance(one, Mapping) or isinstance(many, Mapping):
                out[key] = None
    return out


def cpu_device_figures(
    n: int, drain_s: float, cpu_s: float, replicas: int = 1, model_s: float | None = None
) -> dict[str, float | None]:
    """The CPU and device figures of one drain of ``n`` records (module docstring): from the
    consumer processes' CPU seconds ``cpu_s`` and, when known, the model seconds ``model_s``
    summed over the ``replicas`` processes. Raises ``ValueError`` unless ``n > 0``,
    ``drain_s > 0`` and ``replicas ≥ 1``."""
    if n <= 0 or not drain_s > 0 or replicas < 1:
        raise ValueError(f"need n > 0, drain_s > 0, replicas >= 1; got {n}, {drain_s}, {replicas}")
    us_per_record = cpu_s * 1e6 / n
    out: dict[str, float | None] = {
        "cpu_s": round(cpu_s, 3),
        "cpu_cores_busy": round(cpu_s / drain_s, 2),
        "cpu_us_per_record": round(us_per_record, 1),
        "device_busy_fraction": None,
        "device_seq_per_s": None,
        "cores_per_device": None,
    }
    if model_s is not None and model_s > 0:
        device_seq_per_s = n / model_s
        out["device_busy_fraction"] = round(min(1.0, model_s / (replicas * drain_s)), 3)
        out["device_seq_per_s"] = round(device_seq_per_s, 1)
        out["cores_per_device"] = round(device_seq_per_s * us_per_record / 1e6, 2)
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


_CPU_DEVICE_KEYS = (
    "cpu_us_per_record",
    "cpu_cores_busy",
    "device_busy_fraction",
    "device_seq_per_s",
    "cores_per_device",
)


def print_e2e_table(report: Mapping[str, Any], console: Any) -> None:
    """A rich table of the variants, then the ratios and the setup (``console``: a rich
    ``Console``)."""
    from rich.table import Table

    table = Table(title="kbatch bench e2e")
    cols = ("seq_per_s", "p50_ms", "p99_ms", "latency_rate_per_s", "drain_s", "first_reply_ms")
    table.add_column("variant")
    for c in cols:
        table.add_column(c, justify="right")
    for name, row in report.items():
        if isinstance(row, Mapping) and "seq_per_s" in row:
            table.add_row(name, *(_cell(row.get(c)) for c in cols))
    console.print(table)
    for name, row in report.items():
        if isinstance(row, Mapping) and row.get("cpu_us_per_record") is not None:
            figures = {k: row.get(k) for k in _CPU_DEVICE_KEYS if row.get(k) is not None}
            console.print(f"{name}: {figures}")
    for name, row in report.items():
        if isinstance(row, Mapping) and row.get("stages_ms"):
            stages = ", ".join(
                f"{stage} {v['p50']}/{v['p99']}" for stage, v in row["stages_ms"].items()
            )
            console.print(f"{name} stages p50/p99 ms: {stages}")
        for point in row.get("frontier") or () if isinstance(row, Mapping) else ():
            console.print(
                f"{name} frontier {point['point']} @ {point['rate_per_s']}/s: "
                f"p50 {point['p50_ms']} p99 {point['p99_ms']} ms, "
                f"batch {_cell(point.get('batch_size_mean'))}, "
                f"cpu {_cell(point.get('cpu_ms_per_request'))} ms/request"
            )
    for key, value in report.items():
        if key.startswith(("ratio_", "cpu_ratio_")):
            console.print(f"{key}: {_cell(value)}")
    if report.get("plots"):
        console.print(f"plots: {', '.join(report['plots'])}")
    console.print(f"setup: {report.get('setup')}")


def plot_e2e(report: Mapping[str, Any], out_dir: Path, name: str = "bench_e2e.png") -> Path:
    """One PNG, two panels: throughput (seq/s) and latency p50/p99 (ms) per variant, both on
    log scales; returns its path (``out_dir`` is created)."""
    import matplotlib.pyplot as plt

    from producer_tools.plots import save_png  # selects matplotlib's Agg backend (no display)

    names = [k for k, v in report.items() if isinstance(v, Mapping) and "seq_per_s" in v]
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
    return save_png(fig, out_dir / name, dpi=110)


def plot_frontier(
    report: Mapping[str, Any], out_dir: Path, name: str = "bench_e2e_frontier.png"
) -> Path | None:
    """The latency-throughput frontier: p50 (dashed) and p99 (solid) latency against the
    offered rate, one colour per variant, from each variant's ``frontier`` points (and its
    main latency phase); log latency axis. None when no variant has frontier points."""
    rows = {k: v for k, v in report.items() if isinstance(v, Mapping) and v.get("frontier")}
    if not rows:
        return None
    import matplotlib.pyplot as plt

    from producer_tools.plots import save_png  # selects matplotlib's Agg backend (no display)

    fig, ax = plt.subplots(figsize=(8, 4.8))
    drains: list[tuple[float, str]] = []
    for i, (variant, row) in enumerate(rows.items()):
        points = [
            (float(p["rate_per_s"]), p["p50_ms"], p["p99_ms"])
            for p in row["frontier"]
            if p.get("p99_ms") is not None
        ]
        if row.get("p99_ms") is not None and row.get("latency_rate_per_s") is not None:
            points.append((float(row["latency_rate_per_s"]), row["p50_ms"], row["p99_ms"]))
        points.sort()
        xs = [p[0] for p in points]
        colour = f"C{i}"
        ax.plot(xs, [p[2] for p in points], "o-", color=colour, label=f"{variant} p99")
        ax.plot(xs, [p[1] for p in points], "s--", color=colour, alpha=0.6, label=f"{variant} p50")
        if row.get("seq_per_s"):
            drains.append((float(row["seq_per_s"]), colour))
    right = ax.get_xlim()[1]
    for rate, colour in drains:  # only those inside the measured range
        if rate <= right:
            ax.axvline(rate, color=colour, alpha=0.25, linewidth=1)
    ax.set_xlim(0, right)
    ax.set_yscale("log")
    ax.set_xlabel("offered rate (requests/s, open loop); faint line: the variant's drain rate")
    ax.set_ylabel("latency (ms)")
    model = Path(str(report.get("setup", {}).get("model", "")))
    label = model.parent.name if model.name == "model" else model.name  # packaged: its package
    ax.set_title(f"Latency vs offered load ({label})")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2)
    return save_png(fig, out_dir / name, dpi=110)
