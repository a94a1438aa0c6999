#!/usr/bin/env bash
# Runs every libFuzzer target for a bounded time over its committed seed corpus.
# New inputs go to a scratch folder, so the repository's corpus stays small.
set -euo pipefail
build=${1:-build-asan}
seconds=${2:-20}
root=$(cd "$(dirname "$0")/.." && pwd)
status=0
for target in "$build"/fuzz/fuzz_*; do
  [[ -x $target ]] || continue
  name=$(basename "$target"); name=${name#fuzz_}
  scratch=$(mktemp -d)
  seeds=$root/fuzz/corpus/$name
  dict=(); [[ -f $root/fuzz/$name.dict ]] && dict=(-dict="$root/fuzz/$name.dict")
  echo "fuzz: $name for ${seconds}s"
  if ! "$target" "$scratch" "$seeds" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
      -print_final_stats=1 "${dict[@]}" > "$scratch.log" 2>&1; then
    tail -40 "$scratch.log"
    echo "fuzz: $name FAILED (crash input saved by libFuzzer in the working folder)"
    status=1
  else
    grep -E 'stat::number_of_executed_units|Done' "$scratch.log" | tail -2 || true
  fi
  rm -rf "$scratch" "$scratch.log"
done
exit $status
