#!/usr/bin/env bash
# Runs the benchmarks that need no arguments beyond the build folder, and prints
# each one's ratio against its in-run baseline.
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tools/ensure-demo-checkpoint.sh" "$build" > /dev/null
echo "== bench_check (header parse + validate vs Python json.loads, interleaved)"
"$build/bench/bench_check" "$build/demo-checkpoint" 7
for extra in "$root"/tools/bench-*.sh; do
  [[ -x $extra ]] && { echo "== $(basename "$extra")"; "$extra" "$build"; }
done
