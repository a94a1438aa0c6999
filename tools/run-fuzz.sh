#!/usr/bin/env bash
# Runs every libFuzzer target for a bounded time over its committed seed corpus, JOBS
# targets at a time (each fuzzer is one process on one core: on 2 cores, two at once halve
# the stage), with its dictionary (fuzz/NAME.dict) when there is one. Prints each target's
# inputs executed and inputs per second.
#
# By default new inputs go to a scratch folder, so the repository's corpus stays small.
# FUZZ_CORPUS_DIR=DIR keeps them in DIR/NAME (a campaign resumes from what it found; crash
# inputs go to DIR/artifacts/) and appends one line per target to DIR/campaign.log;
# tools/fuzz-merge.sh moves what adds coverage into fuzz/corpus/. FUZZ_TARGETS="logs
# launch" runs only those targets.
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
keep=${FUZZ_CORPUS_DIR:-}
if [[ -n $keep ]]; then
  mkdir -p "$keep/artifacts"
  keep=$(cd "$keep" && pwd)
fi
artifacts=${keep:+$keep/artifacts/}
artifacts=${artifacts:-$PWD/}

fuzz_one() {  # target -> exit status; its log in $work/NAME.log
  local target=$1 name scratch seeds dict=()
  name=$(basename "$target"); name=${name#fuzz_}
  scratch=${keep:+$keep/$name}; scratch=${scratch:-$work/$name.corpus}; mkdir -p "$scratch"
  seeds=$root/fuzz/corpus/$name
  [[ -f $root/fuzz/$name.dict ]] && dict=(-dict="$root/fuzz/$name.dict")
  "$target" "$scratch" "$seeds" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
    -artifact_prefix="$artifacts$name-" -print_final_stats=1 "${dict[@]}" \
    > "$work/$name.log" 2>&1
}

report() {  # name status
  local name=$1 rc=$2 units time_s rate
  if ((rc != 0)); then
    tail -40 "$work/$name.log"
    echo "fuzz: $name FAILED (the crash input is at $artifacts$name-*)"
  fi
  units=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$name.log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/$name.log" | tail -1)
  time_s=$(( ${units:-0} / (${rate:-0} > 0 ? ${rate:-1} : 1) ))
  echo "fuzz: $name: ${units:-?} inputs in ${time_s} s, $rate inputs/s$( ((rc == 0)) || echo ', FAILED')"
  [[ -z $keep ]] ||
    echo "$(date -u +%FT%TZ) $name ${units:-0} inputs ${time_s} s $rate/s exit $rc" >> "$keep/campaign.log"
}

selected() {  # name -> whether FUZZ_TARGETS (if set) names it
  [[ -z ${FUZZ_TARGETS:-} ]] && return 0
  [[ " $FUZZ_TARGETS " == *" $1 "* ]]
}

status=0
declare -A running=()  # pid -> name
for target in "$build"/fuzz/fuzz_*; do
  [[ -x $target ]] || continue
  name=$(basename "$target"); name=${name#fuzz_}
  selected "$name" || continue
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
