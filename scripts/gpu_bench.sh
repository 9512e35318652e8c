#!/usr/bin/env bash
# The engine benchmark on a CUDA GPU in bf16: tokens/s against the model's FLOP estimate.
#
#   scripts/gpu_bench.sh [OUT_JSON]        (default: bench-gpu.json; at most 8 minutes)
#
# Runs `kbatch bench quality --device cuda --dtype bfloat16` (bf16 against fp32 on 400 VADER
# texts in mixed-length batches: min/mean cosine; written to ${OUT%.json}-quality.json), then
# `kbatch bench engine` (single, fixed, bucketed and the baselines sorted_offline, runner_loop,
# plain_loop on the VADER texts; plain transformers in bf16 on the GPU too) with --device cuda
# --dtype bfloat16 and the GPU token budget, then prints tokens/s, the achieved model TFLOP/s
# (padded tokens/s x 2 x non-embedding parameters, the usual 2-FLOPs-per-parameter-per-token
# estimate, attention not counted) and that as a fraction of the device's dense bf16 peak
# (consumer/model/torch_backend.py's table). The paced phase runs at a fixed RATE that even the
# one-at-a-time strategy sustains on a GPU (its default, half the bucketed rate, would queue
# minutes of work for `single`). Environment overrides: KBATCH (the CLI), N (texts, default
# 10000), RATE (paced arrivals/s, default 300), SECONDS_PACED (default 5), MAX_BATCH_TOKENS
# (default 16384), MAX_BATCH_SIZE (default 256), TIMEOUT_S (default 450), STRATEGIES (default
# single,fixed,bucketed,sorted_offline,runner_loop,plain_loop).
set -euo pipefail
cd "$(dirname "$0")/.."

KBATCH=${KBATCH:-.venv/bin/kbatch}
PY=${PY:-$(dirname "$KBATCH")/python}
OUT=${1:-bench-gpu.json}
N=${N:-10000}
RATE=${RATE:-300}
SECONDS_PACED=${SECONDS_PACED:-5}
MAX_BATCH_TOKENS=${MAX_BATCH_TOKENS:-16384}
MAX_BATCH_SIZE=${MAX_BATCH_SIZE:-256}
TIMEOUT_S=${TIMEOUT_S:-450}
STRATEGIES=${STRATEGIES:-single,fixed,bucketed,sorted_offline,runner_loop,plain_loop}

"$PY" - <<'PY'
import sys
import torch
if not torch.cuda.is_available():
    sys.exit("gpu_bench.sh: torch sees no CUDA device")
print(f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}, CUDA {torch.version.cuda}",
      file=sys.stderr)
PY

timeout 120 "$KBATCH" bench quality --device cuda --dtype bfloat16 --backend torch \
  --no-sentence-transformers --n 400 --json > "${OUT%.json}-quality.json" \
  || echo "gpu_bench.sh: bf16 fails the quality gate (see ${OUT%.json}-quality.json)" >&2
"$PY" -c "import json,sys; r=json.load(open(sys.argv[1])); print('bf16 vs fp32:', r['vs_torch_fp32'], 'passes_gate', r['passes_gate'])" "${OUT%.json}-quality.json" || true

timeout "$TIMEOUT_S" "$KBATCH" bench engine \
  --device cuda --dtype bfloat16 --strategies "$STRATEGIES" \
  --n "$N" --rate "$RATE" --seconds "$SECONDS_PACED" \
  --max-batch-tokens "$MAX_BATCH_TOKENS" --max-batch-size "$MAX_BATCH_SIZE" \
  --batch-overhead-tokens "${BATCH_OVERHEAD_TOKENS:-2048}" \
  --json > "$OUT"

"$PY" - "$OUT" <<'PY'
import json
import sys

r = json.load(open(sys.argv[1]))
s = r["setup"]
print(f"device {s.get('device_name', s.get('device'))}, autocast {s.get('autocast')}, "
      f"{s['texts']} texts (median {s['median_tokens']} tokens, p99 {s['p99_tokens']})")
print(f"{'strategy':<10} {'seq/s':>10} {'tokens/s':>12} {'padded tok/s':>13} {'pad eff':>8} "
      f"{'p50 ms':>8} {'p99 ms':>8}")
for name in ("single", "fixed", "bucketed", "sorted_offline", "runner_loop", "plain_loop"):
    row = r.get(name)
    if row is None:
        continue
    print(f"{name:<10} {row['seq_per_s']:>10} {row['tokens_per_s']:>12} "
          f"{row.get('padded_tokens_per_s', '-'):>13} {row['padding_efficiency']:>8} "
          f"{row.get('p50_ms', '-'):>8} {row.get('p99_ms', '-'):>8}")
params = s.get("params_non_embedding")
print(f"non-embedding parameters: {params}; FLOPs/token ~ 2 x params = "
      f"{2 * params / 1e6:.1f} MFLOP" if params else "non-embedding parameters: unknown")
print(f"bucketed model TFLOP/s: {r.get('bucketed_model_tflops')}; "
      f"vs dense bf16 peak {s.get('peak_tflops_bf16')} TFLOP/s: "
      f"MFU {r.get('bucketed_mfu_vs_bf16_peak')}")
print(f"ratio bucketed/single {r.get('ratio_bucketed_vs_single')}, "
      f"bucketed/fixed {r.get('ratio_bucketed_vs_fixed')}, "
      f"bucketed/sorted_offline {r.get('ratio_bucketed_vs_sorted_offline')}, "
      f"single/plain_loop {r.get('ratio_single_vs_plain_loop')}, "
      f"single batch ms/runner_loop {r.get('ratio_single_batch_ms_vs_runner_loop')}; "
      f"JSON in {sys.argv[1]}")
PY
