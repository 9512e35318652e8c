"""Tables of the CPU budget benchmark runs (scripts/bench_cpu_budget.sh OUT_DIR), as Markdown.

python scripts/summarize_cpu_budget.py OUT_DIR
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any


def _load(out: Path, prefix: str) -> list[tuple[str, dict[str, Any]]]:
    runs = []
    for path in sorted(out.glob(f"{prefix}_*.json")):
        try:
            runs.append((path.stem, json.loads(path.read_text())))
        except json.JSONDecodeError:
            print(f"<!-- {path.name}: no JSON (see {path.stem}.err) -->")
    return runs


def _point(row: dict[str, Any], label: str) -> dict[str, Any] | None:
    return next((p for p in row.get("frontier", []) if p["point"] == label), None)


def _ms(p: dict[str, Any] | None) -> str:
    return "–" if p is None else f"{p['p50_ms']:,.0f} / {p['p99_ms']:,.0f}"


def quota(out: Path) -> None:
    runs = _load(out, "quota")
    if not runs:
        return
    print("| run | drain seq/s | at the common rate: rate, p50 / p99 ms |")
    print("|---|---|---|")
    for name, report in runs:
        row = report["kbatch"]
        common = row["frontier"][0] if row.get("frontier") else None
        if common is None:  # the first old run: its own 0.7x phase is the common rate
            common = {"rate_per_s": row["latency_rate_per_s"], **row}
        print(f"| {name} | {row['seq_per_s']} | {common['rate_per_s']}/s: {_ms(common)} |")
    print()


def colo(out: Path) -> None:
    runs = _load(out, "colo")
    if not runs:
        return
    print("| run | drain seq/s | 0.3× | 0.5× | 0.7× | 0.9× (p50 / p99 ms) |")
    print("|---|---|---|---|---|---|")
    for name, report in runs:
        row = report["kbatch"]
        main = {"p50_ms": row["p50_ms"], "p99_ms": row["p99_ms"]}
        cells = [_ms(_point(row, "0.3x")), _ms(_point(row, "0.5x")), _ms(main)]
        cells.append(_ms(_point(row, "0.9x")))
        print(f"| {name} | {row['seq_per_s']} | " + " | ".join(cells) + " |")
    print()


def host(out: Path) -> None:
    runs = _load(out, "host")
    if not runs:
        return
    print("| run | rate | kbatch ms/request | raw loop ms/request | ratio | p99 ms kbatch / raw |")
    print("|---|---|---|---|---|---|")
    ratios: dict[str, list[float]] = {}
    for name, report in runs:
        for label in ("100/s", "1000/s"):
            k, r = _point(report["kbatch"], label), _point(report["raw_tokenize"], label)
            if k is None or r is None:
                continue
            ratio = k["cpu_ms_per_request"] / r["cpu_ms_per_request"]
            ratios.setdefault(label, []).append(ratio)
            print(
                f"| {name} | {label} | {k['cpu_ms_per_request']:.3f} | "
                f"{r['cpu_ms_per_request']:.3f} | {ratio:.2f} | "
                f"{k['p99_ms']:,.0f} / {r['p99_ms']:,.0f} |"
            )
    for label, values in ratios.items():
        print(f"<!-- mean ratio at {label}: {statistics.mean(values):.2f} -->")
    print()


def sim(out: Path) -> None:
    runs = _load(out, "sim")
    if not runs:
        return
    print("| run | drain seq/s | 50/s | 100/s | 200/s | 400/s | 0.7× (p50 / p99 ms) |")
    print("|---|---|---|---|---|---|---|")
    for name, report in runs:
        row = report["kbatch"]
        cells = [_ms(_point(row, f"{r}/s")) for r in (50, 100, 200, 400)]
        cells.append(f"{row['latency_rate_per_s']}/s: {_ms(row)}")
        print(f"| {name} | {row['seq_per_s']} | " + " | ".join(cells) + " |")
    print()


def main() -> None:
    out = Path(sys.argv[1])
    for section in (quota, colo, host, sim):
        print(f"### {section.__name__}\n")
        section(out)


if __name__ == "__main__":
    main()
