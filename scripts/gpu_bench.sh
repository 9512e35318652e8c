#!/usr/bin/env bash
# The engine benchmark on a CUDA GPU in bf16: tokens/s against the model's FLOP estimate.
#
#   scripts/gpu_bench.sh [OUT_JSON]        (default: bench-gpu.json; at most 8 minutes)
#
# Runs `kbatch bench engine` (single, fixed, bucketed on the VADER texts) with --device cuda
# --autocast bf16 and the GPU token budget, then prints tokens/s, the achieved model TFLOP/s
# (padded tokens/s x 2 x non-embedding parameters, the usual 2-FLOPs-per-parameter-per-token
# estimate, attention not counted) and that as a fraction of the device's dense bf16 peak
# (consumer/model/torch_backend.py's table). The paced phase runs at a fixed RATE that even the
# one-at-a-time strategy sustains on a GPU (its default, half the bucketed rate, would queue
# minutes of work for `single`). Environment overrides: KBATCH (the CLI), N (texts, default
# 10000), RATE (paced arrivals/s, default 300), SECONDS_PACED (default 5), MAX_BATCH_TOKENS
# (default 16384), MAX_BATCH_SIZE (default 256), TIMEOUT_S (default 450).
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

"$PY" - <<'PY'
import sys
import torch
if not torch.cuda.is_available():
    sys.exit("gpu_bench.sh: torch sees no CUDA device")
print(f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}, CUDA {torch.version.cuda}",
      file=sys.stderr)
PY

timeout "$TIMEOUT_S" "$KBATCH" bench engine \
  --device cuda --autocast bf16 \
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
for name in ("single", "fixed", "bucketed"):
    row = r[name]
    print(f"{name:<10} {row['seq_per_s']:>10} {row['tokens_per_s']:>12} "
          f"{row.get('padded_tokens_per_s', '-'):>13} {row['padding_efficiency']:>8} "
          f"{row['p50_ms']:>8} {row['p99_ms']:>8}")
params = s.get("params_non_embedding")
print(f"non-embedding parameters: {params}; FLOPs/token ~ 2 x params = "
      f"{2 * params / 1e6:.1f} MFLOP" if params else "non-embedding parameters: unknown")
print(f"bucketed model TFLOP/s: {r.get('bucketed_model_tflops')}; "
      f"vs dense bf16 peak {s.get('peak_tflops_bf16')} TFLOP/s: "
      f"MFU {r.get('bucketed_mfu_vs_bf16_peak')}")
print(f"ratio bucketed/single {r.get('ratio_bucketed_vs_single')}, "
      f"bucketed/fixed {r.get('ratio_bucketed_vs_fixed')}; JSON in {sys.argv[1]}")
PY
