#!/usr/bin/env bash
# Runs every libFuzzer target for a bounded time over its committed seed corpus, JOBS
# targets at a time (each fuzzer is one process on one core: on 2 cores, two at once halve
# the stage). New inputs go to a scratch folder, so the repository's corpus stays small.
# Usage: tools/run-fuzz.sh BUILD_DIR SECONDS [JOBS]
set -euo pipefail
build=${1:-build-asan}
seconds=${2:-20}
jobs=${3:-$(nproc)}
root=$(cd "$(dirname "$0")/.." && pwd)
# Scratch files (the config and launch targets write each input to a file) go to memory
# when it can: on this disk the writes tripled the launch fuzzer's wall time.
[[ -d /dev/shm && -w /dev/shm ]] && export TMPDIR=${TMPDIR:-/dev/shm}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fuzz_one() {  # target -> exit status; its log in $work/NAME.log
  local target=$1 name scratch seeds dict=()
  name=$(basename "$target"); name=${name#fuzz_}
  scratch=$work/$name.corpus; mkdir -p "$scratch"
  seeds=$root/fuzz/corpus/$name
  [[ -f $root/fuzz/$name.dict ]] && dict=(-dict="$root/fuzz/$name.dict")
  "$target" "$scratch" "$seeds" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
    -print_final_stats=1 "${dict[@]}" > "$work/$name.log" 2>&1
}

report() {  # name status
  local name=$1 rc=$2
  if ((rc != 0)); then
    tail -40 "$work/$name.log"
    echo "fuzz: $name FAILED (crash input saved by libFuzzer in the working folder)"
  else
    echo "fuzz: $name ran ${seconds}s"
    grep -E 'stat::number_of_executed_units|Done' "$work/$name.log" | tail -2 || true
  fi
}

status=0
declare -A running=()  # pid -> name
for target in "$build"/fuzz/fuzz_*; do
  [[ -x $target ]] || continue
  name=$(basename "$target"); name=${name#fuzz_}
  while ((${#running[@]} >= jobs)); do
    rc=0; wait -n -p done_pid "${!running[@]}" || rc=$?
    report "${running[$done_pid]}" "$rc"; ((rc == 0)) || status=1
    unset "running[$done_pid]"
  done
  fuzz_one "$target" &
  running[$!]=$name
done
while ((${#running[@]} > 0)); do
  rc=0; wait -n -p done_pid "${!running[@]}" || rc=$?
  report "${running[$done_pid]}" "$rc"; ((rc == 0)) || status=1
  unset "running[$done_pid]"
done
exit $status
