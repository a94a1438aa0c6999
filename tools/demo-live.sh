#!/usr/bin/env bash
# make demo-live: the motivating deployment replayed end to end on the fixture model, all on
# 127.0.0.1. A checkpoint declares an FP8 KV cache without scales; check flags it; a server
# launched with --kv-cache-dtype auto runs FP8 at scale 1.0 and logs SGLang's warning; logs
# confirms it; probe --compare against a BF16 server measures the difference against its own
# noise floor (and two BF16 servers show no detectable difference); after the fix, logs --expect kv_cache_dtype=bf16 passes.
# Every step checks what it printed; any surprise ends the script with exit 1.
# Usage: demo-live.sh [BUILD_DIR]
set -uo pipefail
build=$(cd "${1:-build}" && pwd)
kvaudit=$build/kvaudit
root=$(cd "$(dirname "$0")/.." && pwd)
model=$root/tests/fixtures/model/qwen3-pystd
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
step() { printf '\n== %s\n' "$*"; }
die() { echo "demo-live: FAILED: $*" >&2; exit 1; }

# Starts `kvaudit serve` with the given flags; sets $url; the start-up log goes to $1.
start_server() {
  local log=$1; shift
  "$kvaudit" serve "$@" --port 0 > "$log" 2>&1 &
  pids+=($!)
  url=""
  for _ in $(seq 1 200); do
    url=$(grep -so 'http://127.0.0.1:[0-9]*' "$log" | tail -n 1)
    [[ -n $url ]] && return 0
    kill -0 "${pids[-1]}" 2>/dev/null || break
    sleep 0.1
  done
  die "server did not start: $(tail -n 3 "$log")"
}

step "A checkpoint whose quant config declares an FP8 KV cache and ships no KV scales"
ckpt=$work/qwen3-fp8kv
mkdir "$ckpt"
for file in "$model"/*; do ln -s "$file" "$ckpt/$(basename "$file")"; done
cat > "$ckpt/hf_quant_config.json" <<'JSON'
{"producer": {"name": "modelopt", "version": "0.29.0"},
 "quantization": {"quant_algo": null, "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}}
JSON
cat "$ckpt/hf_quant_config.json"

step "kvaudit check (SGLang, --kv-cache-dtype auto, --kv-policy lossless: the user's stance)"
"$kvaudit" check "$ckpt" --engine sglang --kv-policy lossless --no-color > "$work/check.txt"; status=$?
sed -n '/fp8-unit-scale/,+3p' "$work/check.txt" | head -8
[[ $status -eq 1 ]] || die "check exit $status, expected 1 (critical)"
grep -q "fp8-unit-scale" "$work/check.txt" || die "check did not report fp8-unit-scale"

step "kvaudit serve --kv-cache-dtype auto (what the deployment ran)"
start_server "$work/auto.log" --model "$ckpt" --kv-cache-dtype auto
url_fp8=$url
grep -E "Using FP8 KV cache but no scaling factors|Using KV cache dtype" "$work/auto.log"
grep -q "Using FP8 KV cache but no scaling factors" "$work/auto.log" || die "no scale warning"

step "kvaudit logs on its start-up log"
"$kvaudit" logs "$work/auto.log" --checkpoint "$ckpt" --no-color > "$work/logs-auto.txt"
grep -iE "kv_cache_dtype|scale" "$work/logs-auto.txt" | head -6
grep -q "fp8_e4m3" "$work/logs-auto.txt" || die "logs did not see fp8_e4m3"

step "kvaudit serve --kv-cache-dtype bf16 (the fix), and a second BF16 instance"
start_server "$work/bf16.log" --model "$ckpt" --kv-cache-dtype bf16
url_bf16=$url
start_server "$work/bf16-second.log" --model "$ckpt" --kv-cache-dtype bf16
url_bf16_second=$url

# Recall plus fixed sequences scored teacher-forced: 12 paired probes, enough for the
# sign-flip test against the control arm (A asked twice) to reach p < 0.01.
recall=(--recall --recall-ctx 512 --recall-depth 64,256 --recall-cases 2 --forced --forced-cases 8
        --fail-on never)
step "kvaudit probe $url_fp8 --compare $url_bf16 ${recall[*]}"
"$kvaudit" probe "$url_fp8" --compare "$url_bf16" "${recall[@]}" --json > "$work/ab.json"
status=$?  # probe's gate: exit 1 when the verdict is "different" (no --gate given)
verdict=$(/usr/bin/python3 -c 'import json,sys; c=json.load(open(sys.argv[1]))["compare"]; print(c["verdict"], "| mean KL", c["mean_kl"], "| diverged", c["diverged"], "| better:", c["better"] or "-")' "$work/ab.json") ||
  die "probe --compare exit $status without a comparison"
echo "A (fp8 at scale 1.0) vs B (bf16): $verdict (exit $status)"
case $status:$verdict in
  "1:different "*) ;;
  *) die "expected 'different' at p < 0.01 with exit 1" ;;
esac

step "kvaudit probe $url_bf16 --compare $url_bf16_second (two BF16 deployments)"
"$kvaudit" probe "$url_bf16" --compare "$url_bf16_second" "${recall[@]}" --json > "$work/aa.json" ||
  die "probe --compare exit $?"
same=$(/usr/bin/python3 -c 'import json,sys; c=json.load(open(sys.argv[1]))["compare"]; print(c["verdict"], "| mean KL", c["mean_kl"], "| diverged", c["diverged"])' "$work/aa.json")
echo "bf16 vs bf16: $same"
[[ $same == "no difference detectable "* ]] || die "two BF16 servers should show no detectable difference"

step "kvaudit logs --expect kv_cache_dtype=bf16: fails on the old launch, passes after the fix"
"$kvaudit" logs "$work/auto.log" --expect kv_cache_dtype=bf16 --quiet; status=$?
[[ $status -eq 1 ]] || die "logs --expect on the FP8 launch exit $status, expected 1"
"$kvaudit" logs "$work/bf16.log" --expect kv_cache_dtype=bf16 --quiet || die "logs --expect after the fix exit $?"
echo
echo "demo-live: the FP8-without-scales story, caught at every stage"
