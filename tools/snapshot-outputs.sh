#!/usr/bin/env bash
# Writes the terminal and JSON output of make demo, check, plan, logs, quant and eval on the
# repository's fixtures into OUT_DIR, one file per command, so a refactoring can prove its
# output byte-identical: run it before and after, then `diff -r BEFORE AFTER`.
# Timings ("Checkpoint read", "read_seconds", throughput) are blanked: they are the only
# bytes that differ between two runs of the same binary.
# Usage: tools/snapshot-outputs.sh BUILD_DIR OUT_DIR
set -uo pipefail
build=$(cd "${1:?usage: snapshot-outputs.sh BUILD_DIR OUT_DIR}" && pwd)
out=${2:?usage: snapshot-outputs.sh BUILD_DIR OUT_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
kvaudit=$build/kvaudit
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$root"
"$root/tools/ensure-demo-checkpoint.sh" "$build" > /dev/null
# Timings vary run to run; everything else must not.
blank() {
  sed -E -e 's/(Checkpoint read[^:]*: *)[0-9.]+ (ms|s)/\1T/' \
         -e 's/"([a-z_]*seconds|[a-z_]*gflops|[a-z_]*per_second|read_ms)": *[0-9.eE+-]+/"\1": T/g' \
         -e 's/"value": *[0-9.eE+-]+, *"unit": *"ms"/"value": T, "unit": "ms"/g'
}
run() {  # run NAME ARGS...: stdout+stderr and the exit code
  local name=$1; shift
  { "$kvaudit" "$@" 2>&1; echo "exit $?"; } | blank > "$out/$name.txt"
}
tools/demo.sh "$kvaudit" 2>&1 | blank > "$out/demo.txt"
for dir in "$build"/fixtures/*/; do
  name=$(basename "$dir")
  [[ -f $dir/config.json ]] || continue
  for engine in sglang vllm; do
    run "check-$name-$engine" check "build/fixtures/$name" --engine "$engine" --no-color
    run "check-$name-$engine-json" check "build/fixtures/$name" --engine "$engine" --json
    run "check-$name-$engine-gpu" check "build/fixtures/$name" --engine "$engine" --gpu h100 --no-color
    run "plan-$name-$engine" plan "build/fixtures/$name" --engine "$engine" --gpu h100 --json
  done
done
for config in tests/fixtures/configs/*/config.json; do
  name=$(basename "$(dirname "$config")")
  run "plan-config-$name" plan "$config" --engine sglang --gpu h200 --tp 8 --json
done
for log in tests/fixtures/logs/*.log tests/fixtures/logs/real/*/*.log; do
  name=$(basename "$log" .log)
  run "logs-$name" logs "$log" --json
  run "plan-from-log-$name" plan build/demo-checkpoint --from-log "$log" --no-color
done
run quant quant --formats fp8_e4m3:none,fp8_e4m3:tensor,int4:kivi --synthetic outlier-keys \
  --ctx 512,1k --kv-heads 2 --q-heads 4 --head-dim 64 --queries 2 --threads 2 --json
model=tests/fixtures/model/qwen3-pystd
run eval eval --model "$model" --kv bf16 --kv fp8_e5m2 --text "$model/heldout.txt" --ctx 128 \
  --chunks 2 --recall --recall-ctx 256 --recall-depth 16 --recall-cases 1 --json
echo "$(ls "$out" | wc -l) outputs in $out"
