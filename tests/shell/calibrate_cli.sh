#!/usr/bin/env bash
# kvaudit calibrate end to end on the trained fixture model: the overlay, the stats file
# round trip, check on checkpoint + overlay, eval with the scales, and refusals (exit 2,
# one line naming the reason, nothing left behind).
source "$(dirname "$0")/lib.bash" "$@"
model=$root/tests/fixtures/model/qwen3-pystd
head -c 20000 "$model/heldout.txt" > "$work/calib.txt"

json=$("$kvaudit" calibrate --model "$model" --text "$work/calib.txt" --engine vllm \
  --out "$work/overlay" --stats-out "$work/stats.json" --ctx 512 --json); status=$?
[[ $status -eq 0 ]] && pass || fail "calibrate exit $status"
for file in kv_scales.safetensors config.json kvaudit-calibration.json; do
  [[ -s $work/overlay/$file ]] && pass || fail "overlay lacks $file"
done
/usr/bin/python3 - "$json" "$work/stats.json" <<'PY' && pass || fail "JSON payload / stats file"
import json, sys
doc = json.loads(sys.argv[1])
cal = doc["calibration"]
assert cal["carrier"] == "kv-only-compressed-tensors", cal["carrier"]
assert cal["resolved_kv"] == {"kv_cache_dtype": "fp8_e4m3", "scale_source": "checkpoint"}
assert len(cal["tensors"]) == 8 and len(cal["layers"]) == 4
stats = json.load(open(sys.argv[2]))
assert stats["format"] == "kvaudit-kv-stats/1" and len(stats["layers"]) == 4
for layer, scales in zip(stats["layers"], cal["layers"]):
    # scale = amax / 448 (margin 1), to float precision
    assert abs(scales["k_scale"][0] * 448 / max(layer["k_amax"]) - 1) < 1e-6
PY

# The maxima settle what check could only bound: the same model with an FP8 cache at scale
# 1.0, judged on the measured maxima (they fit: a note), then the lossless policy (critical).
out=$("$kvaudit" check "$model" --engine vllm --engine-version 0.22.0 --kv-cache-dtype fp8 \
  --kv-stats "$work/stats.json" --json); status=$?
[[ $status -eq 0 ]] && pass || fail "check --kv-stats exit $status"
/usr/bin/python3 - "$out" <<'PY' && pass || fail "check --kv-stats judged on the maxima"
import json, sys
doc = json.loads(sys.argv[1])
unit = [f for f in doc["findings"] if f["id"] == "fp8-unit-scale"][0]
assert unit["basis"] == "measured" and unit["severity"] == "info", unit
assert "stats.json" in json.dumps(unit["evidence"])
PY
"$kvaudit" check "$model" --engine vllm --engine-version 0.22.0 --kv-cache-dtype fp8 \
  --kv-stats "$work/stats.json" --kv-policy lossless -q > /dev/null
[[ $? -eq 1 ]] && pass || fail "lossless should fail the measured FP8 cache"
err=$("$kvaudit" check "$model" --engine vllm --kv-cache-dtype fp8 --kv-stats "$work/missing.json" \
  2>&1 >/dev/null); status=$?
[[ $status -eq 2 && $err == *"missing.json"* && $(wc -l <<< "$err") -eq 1 ]] \
  && pass || fail "--kv-stats missing file: $status $err"

# The same scales from the stats file: identical bytes in the scales file.
"$kvaudit" calibrate --model "$model" --from-stats "$work/stats.json" --engine vllm \
  --out "$work/overlay2" --quiet > /dev/null && pass || fail "--from-stats exit $?"
cmp -s "$work/overlay/kv_scales.safetensors" "$work/overlay2/kv_scales.safetensors" \
  && pass || fail "--from-stats wrote different scales"

# kvaudit check on the checkpoint with the overlay beside it: scales load, nothing critical.
mkdir "$work/deployed"
for f in "$model"/*; do ln -s "$f" "$work/deployed/$(basename "$f")"; done
rm "$work/deployed/config.json"; cp "$work/overlay"/* "$work/deployed/"
"$kvaudit" check "$work/deployed" --engine vllm --kv-cache-dtype fp8 --json > "$work/check.json"
status=$?
[[ $status -eq 0 ]] && pass || fail "check on checkpoint + overlay exit $status"
grep -q '"scale_source": *"checkpoint"' "$work/check.json" && pass || fail "check: scales not loaded"
# ... and SGLang before PR #35455 drops compressed-tensors scales: check says so (exit 1);
# releases with it load them.
"$kvaudit" check "$work/deployed" --engine sglang --engine-version 0.5.15 --kv-cache-dtype fp8_e4m3 --quiet > /dev/null
[[ $? -eq 1 ]] && pass || fail "check under sglang 0.5.15 should flag the dropped scales"
"$kvaudit" check "$work/deployed" --engine sglang --engine-version 0.5.23 --kv-cache-dtype fp8_e4m3 --quiet > /dev/null
[[ $? -eq 0 ]] && pass || fail "check under sglang 0.5.23 should load the compressed-tensors scales"

# eval applies the overlay's scales.
out=$("$kvaudit" eval --model "$model" --kv bf16 --kv fp8_e4m3:tensor --text "$work/calib.txt" \
  --ctx 128 --chunks 1 --kv-scales "$work/overlay" --json); status=$?
[[ $status -eq 0 && $out == *"scales loaded from"* ]] && pass || fail "eval --kv-scales ($status)"

# Refusals: one line, exit 2, no overlay folder left.
expect_refusal() {
  local what=$1 needle=$2; shift 2
  err=$("$kvaudit" calibrate "$@" 2>&1 >/dev/null); status=$?
  [[ $status -eq 2 ]] && pass || fail "$what: exit $status"
  [[ $(wc -l <<< "$err") -eq 1 && $err == *"$needle"* ]] && pass || fail "$what: message '$err'"
}
expect_refusal "per-head for sglang" "per-tensor" --model "$model" --from-stats "$work/stats.json" \
  --engine sglang --granularity head --out "$work/refused1"
[[ ! -e $work/refused1 ]] && pass || fail "refused run left a folder"
expect_refusal "into the checkpoint" "never modifies" --model "$model" \
  --from-stats "$work/stats.json" --engine vllm --out "$model"
expect_refusal "no input" "exactly one" --model "$model" --engine vllm --out "$work/refused2"
echo '{"format":"kvaudit-kv-stats/1","num_layers":4,"num_kv_heads":2,"layers":[]}' > "$work/bad.json"
expect_refusal "stats missing layers" "layer 0 is missing" --model "$model" \
  --from-stats "$work/bad.json" --engine vllm --out "$work/refused3"
echo '{"format":"kvaudit-kv-stats/1","num_layers":3,"num_kv_heads":2,"layers":[
  {"layer":0,"k_amax":1,"v_amax":1},{"layer":1,"k_amax":1,"v_amax":1},{"layer":2,"k_amax":1,"v_amax":1}]}' \
  > "$work/bad2.json"
expect_refusal "stats for another model" "3 layers" --model "$model" \
  --from-stats "$work/bad2.json" --engine vllm --out "$work/refused4"
printf '{"format": ' > "$work/truncated.json"
expect_refusal "truncated stats" "not valid JSON" --model "$model" \
  --from-stats "$work/truncated.json" --engine vllm --out "$work/refused5"

finish calibrate_cli
