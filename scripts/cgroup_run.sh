#!/usr/bin/env bash
# Run a command inside a CPU-limited cgroup: scripts/cgroup_run.sh NAME [CPUS] [--] COMMAND...
#
# Creates (or reuses) the cgroup NAME with a CFS quota of CPUS cores (default 1: quota 100000 µs
# per 100000 µs period), moves this shell into it and execs COMMAND, so COMMAND and everything it
# starts run under the quota from their first instruction (kbatch reads its CPU budget at
# start-up: docs/CPU.md). cgroup v1 (a `cpu` hierarchy under /sys/fs/cgroup/cpu) or v2 (the
# unified hierarchy with the cpu controller). Needs root (or a delegated cgroup); says so and
# exits 77 when the cgroup cannot be written. Remove the group afterwards with
# `rmdir /sys/fs/cgroup/cpu/NAME` (v1) or `rmdir /sys/fs/cgroup/NAME` (v2) once it is empty.
set -euo pipefail
name=${1:?usage: cgroup_run.sh NAME [CPUS] -- COMMAND...}
shift
cpus=1
if [[ $# -gt 0 && $1 =~ ^[0-9]+(\.[0-9]+)?$ ]]; then cpus=$1; shift; fi  # CPUS is optional
if [[ ${1:-} == "--" ]]; then shift; fi
[[ $# -gt 0 ]] || { echo "cgroup_run.sh: no command" >&2; exit 2; }
period=100000
quota=$(python3 -c "import sys; print(int(float(sys.argv[1]) * $period))" "$cpus")

if [[ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]]; then          # cgroup v1
  dir=/sys/fs/cgroup/cpu/$name
  mkdir -p "$dir" 2>/dev/null || { echo "cgroup_run.sh: cannot create $dir (root?)" >&2; exit 77; }
  echo "$period" > "$dir/cpu.cfs_period_us"
  echo "$quota" > "$dir/cpu.cfs_quota_us"
elif grep -qw cpu /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then   # cgroup v2
  dir=/sys/fs/cgroup/$name
  echo +cpu > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
  mkdir -p "$dir" 2>/dev/null || { echo "cgroup_run.sh: cannot create $dir (root?)" >&2; exit 77; }
  echo "$quota $period" > "$dir/cpu.max"
else
  echo "cgroup_run.sh: no writable cpu cgroup controller here" >&2; exit 77
fi
echo $$ > "$dir/cgroup.procs" 2>/dev/null \
  || { echo "cgroup_run.sh: cannot join $dir (root?)" >&2; exit 77; }
exec "$@"
