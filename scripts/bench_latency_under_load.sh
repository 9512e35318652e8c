#!/usr/bin/env bash
# The latency-under-load figures in one go, on a quiet machine (BENCHMARKS.md §Latency under load):
#
#   scripts/bench_latency_under_load.sh OUT_DIR        (estimated 10-12 minutes on 2 cores; at most 15)
#
# 1. The MiniLM frontier: naive, kbatch, kbatch_bf16 and engine drain N requests each, then
#    answer open-loop phases at 0.7 (the main phase), 0.3, 0.5 and 0.9 x each variant's own
#    drain rate and at 15/30/45/60 req/s for all (up to naive's drain rate):
#    OUT_DIR/minilm/bench_e2e_frontier_minilm.json and bench_e2e_frontier.png.
# 2. The simulated H200 (sim:1,0.445: a sleep of 1 ms + 0.445 us per padded token), kbatch at
#    50/100/200/400 req/s: the Kafka path's own cost (intake + reply p99):
#    OUT_DIR/sim/bench_e2e_frontier_sim.json and its PNG.
# Prints `uptime` before and after each (a load above ~1.5 means the figures are contended),
# then the figures against their goals. Environment overrides: KBATCH (the CLI), N (MiniLM
# drain, default 2000), LATENCY_S (measured seconds per phase, default 8), SIM_N (default
# 5000), VARIANTS (default naive,kbatch,kbatch_bf16,engine). Needs the broker at
# 127.0.0.1:9092 (`make broker`).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${1:?usage: scripts/bench_latency_under_load.sh OUT_DIR}
KBATCH=${KBATCH:-.venv/bin/kbatch}
PY=${PY:-$(dirname "$KBATCH")/python}
N=${N:-2000}
LATENCY_S=${LATENCY_S:-8}
SIM_N=${SIM_N:-5000}
VARIANTS=${VARIANTS:-naive,kbatch,kbatch_bf16,engine}
mkdir -p "$OUT/minilm" "$OUT/sim"

echo "== MiniLM frontier ($VARIANTS, N=$N, ${LATENCY_S}s per phase)"
uptime
start=$(date +%s)
"$KBATCH" bench e2e --variants "$VARIANTS" --n "$N" \
  --latency-s "$LATENCY_S" --latency-warmup-s 2 --latency-fractions 0.3,0.5,0.9 \
  --latency-rates 15,30,45,60 --plots-dir "$OUT/minilm" --log-dir "$OUT/minilm/logs" --json \
  > "$OUT/minilm/bench_e2e_frontier_minilm.json"
uptime
echo "   took $(($(date +%s) - start)) s"

echo "== Simulated H200 (sim:1,0.445, kbatch, N=$SIM_N)"
uptime
start=$(date +%s)
"$KBATCH" bench e2e --model sim:1,0.445 --variants kbatch --n "$SIM_N" \
  --latency-s "$LATENCY_S" --latency-warmup-s 2 --latency-rates 50,100,200,400 \
  --plots-dir "$OUT/sim" --log-dir "$OUT/sim/logs" --json > "$OUT/sim/bench_e2e_frontier_sim.json"
uptime
echo "   took $(($(date +%s) - start)) s"

"$PY" scripts/summarize_latency_under_load.py "$OUT/minilm/bench_e2e_frontier_minilm.json" \
  "$OUT/sim/bench_e2e_frontier_sim.json"
