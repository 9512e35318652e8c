#!/usr/bin/env bash
# The CPU budget benchmarks (BENCHMARKS.md §CPU budget), A/B alternated in one window: today's thread defaults ("old": torch on
# every core the process sees, the tokenizer's Rayon pool on every logical CPU) against the CPU
# budget plan ("new", --threads auto). JSON per run under OUT_DIR, `uptime` before each run;
# summarize with scripts/summarize_cpu_budget.py OUT_DIR. About 25 minutes on the 2-core machine.
#
#   scripts/bench_cpu_budget.sh OUT_DIR [ROUNDS]
#
# 1. quota:   kbatch serve in a 1-CPU cgroup (scripts/cgroup_run.sh; needs root), MiniLM fp32
#             through Kafka; the latency phase of all at 0.7 x the first old run's drain rate;
#             also "big" (today's default on an 8-core node: 8 torch and 8 Rayon threads) and
#             "one" (one torch thread per quota core, no burst).
# 2. colo:    no quota (broker and load client on the same cores); the frontier at
#             0.3/0.5/0.7/0.9 of each variant's own drain.
# 3. host:    serve's CPU ms per request on a simulated H200 (sim:1,0.445, real tokenizer)
#             against a raw aiokafka consume -> tokenize -> reply loop, at 100 and 1,000 req/s.
# 4. sim:     the simulated H200 frontier (50/100/200/400 req/s), old against new.
# SKIP=quota,colo,host,sim leaves sections out.
set -euo pipefail
out=${1:?usage: bench_cpu_budget.sh OUT_DIR [ROUNDS]}
rounds=${2:-2}
here=$(cd "$(dirname "$0")/.." && pwd)
kbatch=${KBATCH:-$here/.venv/bin/kbatch}
mkdir -p "$out"
group=kbatch-bench32-$$
quota=("$here/scripts/cgroup_run.sh" "$group" 1 --)
old_env=(env RAYON_NUM_THREADS=2 TOKENIZERS_PARALLELISM=true)
new_env=(env -u RAYON_NUM_THREADS -u TOKENIZERS_PARALLELISM -u OMP_NUM_THREADS)
cleanup() { rmdir "/sys/fs/cgroup/cpu/$group" "/sys/fs/cgroup/$group" 2>/dev/null || true; }
trap cleanup EXIT

run() {  # run NAME ENV... -- ARGS...
  local name=$1; shift
  local envs=()
  while [[ $1 != "--" ]]; do envs+=("$1"); shift; done
  shift
  { echo "== $name $(date -u +%T)"; uptime; } | tee -a "$out/uptime.log" >&2
  "${envs[@]}" "$kbatch" bench e2e "$@" --json > "$out/$name.json" 2> "$out/$name.err"
}

minilm=(--variants kbatch --n 1500 --latency-s 8 --latency-warmup-s 2)
want() { [[ ",${SKIP:-}," != *",$1,"* ]]; }

# 1. quota: the first old run sets the common rate
if want quota; then
run quota_old_1 "${old_env[@]}" -- "${minilm[@]}" --threads 2 --serve-prefix "${quota[*]}"
rate=$(python3 -c "import json,sys; print(round(0.7*json.load(open(sys.argv[1]))['kbatch']['seq_per_s'],1))" "$out/quota_old_1.json")
echo "common rate for the quota runs: $rate/s" | tee -a "$out/uptime.log" >&2
quota_run() {  # quota_run NAME ENV-ARRAY-NAME THREADS
  local -n envs=$2
  run "$1" "${envs[@]}" -- "${minilm[@]}" --threads "$3" --serve-prefix "${quota[*]}" \
    --latency-rates "$rate"
}
big_env=(env RAYON_NUM_THREADS=8 TOKENIZERS_PARALLELISM=true)
quota_run quota_new_1 new_env auto
quota_run quota_big_1 big_env 8    # today's default on an 8-core node under the same quota
quota_run quota_one_1 new_env 1    # one thread per quota core, no burst
for r in $(seq 2 "$rounds"); do
  quota_run "quota_old_$r" old_env 2
  quota_run "quota_new_$r" new_env auto
  quota_run "quota_big_$r" big_env 8
  quota_run "quota_one_$r" new_env 1
done
# (quota_old_1's own 0.7x phase is at the same rate)
fi

# 2. co-located, no quota
want colo && for r in $(seq 1 "$rounds"); do
  run "colo_old_$r" "${old_env[@]}" -- "${minilm[@]}" --threads 2 --latency-fractions 0.3,0.5,0.9
  run "colo_new_$r" "${new_env[@]}" -- "${minilm[@]}" --threads auto --latency-fractions 0.3,0.5,0.9
done

# 3. host CPU per request, kbatch (new defaults) against the raw loop, same run
want host && for r in $(seq 1 "$rounds"); do
  run "host_$r" "${new_env[@]}" -- --model sim:1,0.445 --variants kbatch,raw_tokenize --n 3000 \
    --threads auto --latency-s 10 --latency-warmup-s 2 --latency-rates 100,1000 \
    --max-latency-rate 1000
done

# 4. the simulated H200 frontier, old against new
want sim && for r in $(seq 1 "$rounds"); do
  run "sim_old_$r" "${old_env[@]}" -- --model sim:1,0.445 --variants kbatch --n 5000 \
    --threads 2 --latency-s 8 --latency-warmup-s 2 --latency-rates 50,100,200,400
  run "sim_new_$r" "${new_env[@]}" -- --model sim:1,0.445 --variants kbatch --n 5000 \
    --threads auto --latency-s 8 --latency-warmup-s 2 --latency-rates 50,100,200,400
done
{ echo "== done $(date -u +%T)"; uptime; } | tee -a "$out/uptime.log" >&2
