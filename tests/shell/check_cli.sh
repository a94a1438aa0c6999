#!/usr/bin/env bash
# kvaudit check end to end: the demo finding, JSON schema keys, gates, usage, and
# malformed input (one line on stderr naming the file, exit 2, no crash).
source "$(dirname "$0")/lib.bash" "$@"

demo=$("$root/tools/ensure-demo-checkpoint.sh" "$build") || exit 1
# Under ASan+UBSan each check of the demo's 371444-tensor header takes ~10 s: the first two
# runs parse it under the sanitizers; the runs that repeat that parsing with other flags
# (policies, gates, a unit, --html) are the release build's.
sanitized=0
grep -q "KVAUDIT_SANITIZE:BOOL=ON" "$build/CMakeCache.txt" 2>/dev/null && sanitized=1

# The motivating case under its user's stance (lossless): exit 1, the finding, the file,
# the missing tensors, the fix.
out=$("$kvaudit" check "$demo" --engine sglang --tp 8 --kv-policy lossless --no-color); status=$?
[[ $status -eq 1 ]] && pass || fail "demo exit $status, expected 1"
for needle in "fp8-unit-scale" "fp8_e4m3" "scale 1.0" "--kv-cache-dtype bf16" "hf_quant_config.json" \
    "371444 tensors"; do
  grep -qF -- "$needle" <<< "$out" && pass || fail "demo report lacks '$needle'"
done
# JSON: the same verdict (exit 1), documented top-level keys and finding fields. Long
# names wrap in the terminal; the JSON carries them whole. (Each check of the demo's
# 371444-tensor header takes ~10 s under ASan: one JSON run serves every JSON check.)
json=$("$kvaudit" check "$demo" --engine sglang --tp 8 --kv-policy lossless --json); status=$?
[[ $status -eq 1 ]] && pass || fail "demo --json exit $status, expected 1"
[[ $json == *"model.language_model.layers.3.self_attn.k_proj.k_scale"* ]] \
  && pass || fail "demo report does not name the missing scale tensors"
/usr/bin/python3 - "$json" <<'PY' && pass || fail "JSON schema"
import json, sys
doc = json.loads(sys.argv[1])
assert doc["engine"]["name"] == "sglang"
assert doc["resolved_kv"]["kv_cache_dtype"] == "fp8_e4m3"
assert doc["resolved_kv"]["scale_source"] == "unit_default"
ids = [f["id"] for f in doc["findings"]]
assert "fp8-unit-scale" in ids, ids
assert doc["kv_policy"] == "lossless"
for f in doc["findings"]:
    for key in ("id", "severity", "title", "evidence", "fix", "basis", "judged_on"):
        assert key in f, key
unit = [f for f in doc["findings"] if f["id"] == "fp8-unit-scale"][0]
assert unit["severity"] == "critical" and unit["basis"] == "published", unit
# The sparse stand-in's key norms are all zeros: said, and not taken as a bound.
assert "sparse stand-in" in unit["judged_on"], unit["judged_on"]
PY

if ((sanitized == 0)); then
# The default policy judges the same launch on evidence: published Qwen3.5 measurements,
# no bound from the stand-in: a warning that says what would settle it, exit 0.
out=$("$kvaudit" check "$demo" --engine sglang --tp 8 --no-color); status=$?
[[ $status -eq 0 ]] && pass || fail "demo under the default policy: exit $status, expected 0"
for needle in "KV policy:" "Judged on:" "--kv-stats" "Verdict [warning]"; do
  grep -qF -- "$needle" <<< "$out" && pass || fail "default-policy report lacks '$needle'"
done

# The fix passes the gate; --fail-on never always passes; --fail-on warning is stricter.
"$kvaudit" check "$demo" --engine sglang --tp 8 --kv-cache-dtype bf16 -q > /dev/null && pass || fail "bf16 should pass"
"$kvaudit" check "$demo" --engine sglang --fail-on never -q > /dev/null && pass || fail "--fail-on never"
"$kvaudit" check "$demo" --unit "$root/examples/qwen3.5-397b-a17b-nvfp4/sglang.service" \
  --kv-policy lossless -q > /dev/null
[[ $? -eq 1 ]] && pass || fail "unit file launch should fail the lossless gate"
"$kvaudit" check "$demo" --engine vllm --engine-version 0.11.0 --fail-on warning -q > /dev/null && pass \
  || fail "vllm 0.11 keeps bf16 under auto: no warning expected"
fi

# Bare command: usage that points at the demo, exit 2.
err=$("$kvaudit" check 2>&1 >/dev/null); status=$?
[[ $status -eq 2 && $err == *"make demo"* ]] && pass || fail "bare check: exit $status, '$err'"

# Malformed input: exit 2, exactly one line, naming the file.
expect_error() {  # name, expected substring, args...
  local name=$1 needle=$2; shift 2
  local err status
  err=$("$kvaudit" check "$@" 2>&1 >/dev/null); status=$?
  local lines; lines=$(printf '%s' "$err" | grep -c '')
  if [[ $status -eq 2 && $lines -eq 1 && $err == *"$needle"* ]]; then pass; else
    fail "$name: exit $status, $lines line(s): $err"; fi
}
mk() { mkdir -p "$work/$1"; printf '%s' "$2" > "$work/$1/config.json"; }
cfg='{"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4}'
mk truncated "$cfg"; printf 'abc' > "$work/truncated/model.safetensors"
expect_error truncated "model.safetensors: truncated" "$work/truncated" --engine sglang
mk lying "$cfg"; printf '\xff\x00\x00\x00\x00\x00\x00\x00{}' > "$work/lying/model.safetensors"
expect_error lying-length "runs past the end" "$work/lying" --engine sglang
mk badjson '{"model_type": llama}'
expect_error invalid-json "config.json: invalid JSON" "$work/badjson" --engine vllm
mkdir -p "$work/empty"
expect_error empty-dir "folder is empty" "$work/empty" --engine sglang
expect_error missing-dir "no such file or folder" "$work/nope" --engine sglang
mk shard "$cfg"; printf '{"weight_map":{"a":"model-00001-of-00002.safetensors"}}' > "$work/shard/model.safetensors.index.json"
expect_error missing-shard "which is missing" "$work/shard" --engine sglang
# Flag errors do not depend on the checkpoint: a bare config folder serves.
small=$root/tests/fixtures/configs/kimi-k2.5
expect_error bad-version "cannot read version" "$small" --engine sglang --engine-version banana
expect_error bad-launch "starts no known engine" "$small" --launch "python app.py"
expect_error bad-unit "no such file" "$small" --unit "$work/none.service"
expect_error engine-mismatch "says vllm" "$small" --engine vllm --launch "python -m sglang.launch_server --tp 2"
expect_error bad-context "token count" "$small" --engine sglang --context-length lots
expect_error trtllm-config "named by --config" "$small" --launch "trtllm-serve /m --config $work/none.yaml"

# NaN scales: a critical finding naming the tensor, exit 1, never a crash.
nan=$build/fixtures/llama-modelopt-nan-scales
"$build/kvaudit_make_checkpoint" "$root/tests/fixtures/checkpoints/llama-modelopt-nan-scales/manifest.json" "$work/nan" > /dev/null
out=$("$kvaudit" check "$work/nan" --engine sglang --json); status=$?
[[ $status -eq 1 && $out == *"layers.1.self_attn.k_proj.k_scale = NaN"* ]] && pass || fail "NaN scale: exit $status"

# --html writes a complete file atomically.
if ((sanitized == 0)); then
"$kvaudit" check "$demo" --engine sglang --html "$work/report.html" -q > /dev/null
[[ -s $work/report.html ]] && grep -q "fp8-unit-scale" "$work/report.html" && pass || fail "--html output"
ls "$work"/.report.html.tmp* > /dev/null 2>&1 && fail "temporary HTML file left behind" || pass
fi

finish check_cli
