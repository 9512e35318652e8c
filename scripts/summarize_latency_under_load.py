"""Print the latency-under-load figures from `kbatch bench e2e --json` reports
(scripts/bench_latency_under_load.sh).

    python scripts/summarize_latency_under_load.py MINILM_JSON [SIM_JSON]

MiniLM: per variant drain, p50/p99 and mean batch at the 0.7 phase, kbatch/engine ratios
(goal: <= 1.5), drain against 0.95 x 215.3 seq/s, and per frontier point p99 of kbatch against
naive at the shared rates (goal: kbatch <= naive). Simulated H200: per offered rate p50/p99 and
the Kafka path's added p99 (intake + reply).
"""

from __future__ import annotations

import json
import sys
from typing import Any

DRAIN_GOAL = 0.95 * 215.3  # seq/s: 0.95 x kbatch's MiniLM drain on a quiet machine


def _stage(row: dict[str, Any], name: str, q: str) -> float:
    return float((row.get("stages_ms") or {}).get(name, {}).get(q, float("nan")))


def minilm(report: dict[str, Any]) -> None:
    print("variant       drain/s  p50 ms  p99 ms  batch(0.7)")
    for name in ("naive", "kbatch", "kbatch_bf16", "engine"):
        row = report.get(name)
        if isinstance(row, dict) and "seq_per_s" in row:
            batch = row.get("latency_batch_size_mean")
            print(f"{name:12s} {row['seq_per_s']:8.1f} {row['p50_ms']:7.0f} {row['p99_ms']:7.0f}"
                  f"  {batch}")  # fmt: skip
    kb, en, nv = report.get("kbatch"), report.get("engine"), report.get("naive")
    if kb and en:
        print(f"kbatch/engine at 0.7: p50 {kb['p50_ms'] / en['p50_ms']:.2f}x, "
              f"p99 {kb['p99_ms'] / en['p99_ms']:.2f}x (goal <= 1.5x)")  # fmt: skip
    if kb:
        ok = "ok" if kb["seq_per_s"] >= DRAIN_GOAL else "BELOW"
        print(f"kbatch drain {kb['seq_per_s']:.1f} seq/s vs goal {DRAIN_GOAL:.1f}: {ok}")
    if kb and nv:
        naive_points = {p["point"]: p for p in nv.get("frontier", [])}
        for p in kb.get("frontier", []):
            q = naive_points.get(p["point"])
            if q is not None and p["point"].endswith("/s"):
                verdict = "ok" if p["p99_ms"] <= q["p99_ms"] else "ABOVE"
                print(f"  {p['point']:>6s}: kbatch p99 {p['p99_ms']:.0f} ms, "
                      f"naive {q['p99_ms']:.0f} ms: {verdict}")  # fmt: skip


def sim(report: dict[str, Any]) -> None:
    row = report.get("kbatch") or {}
    print(f"sim kbatch drain {row.get('seq_per_s')} seq/s")
    for p in [{"point": "0.7x", **row}, *row.get("frontier", [])]:
        added = _stage(p, "intake", "p99") + _stage(p, "reply", "p99")
        print(f"  {p['point']:>6s}: p50 {p['p50_ms']:.1f} p99 {p['p99_ms']:.1f} ms, "
              f"Kafka path p99 (intake + reply) {added:.1f} ms")  # fmt: skip


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        minilm(json.load(f))
    if len(sys.argv) > 2:
        with open(sys.argv[2]) as f:
            sim(json.load(f))
