#!/usr/bin/env bash
# Runs the benchmarks that need no arguments beyond the build folder, and prints
# each one's ratio against its in-run baseline.
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
example=$root/examples/qwen3.5-397b-a17b-nvfp4
if [[ ! -f $build/demo-checkpoint/model.safetensors.index.json ]]; then
  "$build/kvaudit_make_checkpoint" "$example/manifest.json" "$build/demo-checkpoint"
fi
echo "== bench_check (issue: header parsing >= 10x Python json)"
"$build/bench/bench_check" "$build/demo-checkpoint" 5
for extra in "$root"/tools/bench-*.sh; do
  [[ -x $extra ]] && { echo "== $(basename "$extra")"; "$extra" "$build"; }
done
