#!/usr/bin/env bash
# kvaudit plan / kvaudit logs end to end: the motivating numbers, --expect exit codes,
# and bad input (empty, binary, truncated ServerArgs, missing file) failing cleanly.
# usage: plan_logs_cli.sh KVAUDIT_BINARY SOURCE_DIR BUILD_DIR
source "$(dirname "$0")/lib.bash" "$@"
BIN=$kvaudit
SRC=$root
BUILD=$build
TMP=$work
FIX="$SRC/tests/fixtures/logs"
CONFIG="$SRC/examples/qwen3.5-397b-a17b-nvfp4/config.json"
check() {  # check NAME EXPECTED_RC ACTUAL_RC
  if [ "$2" != "$3" ]; then fail "$1: exit $3, expected $2"; else pass; fi
}
json() {  # json FILE PYTHON_EXPR -> prints the value
  /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"
}

# plan: the motivating deployment's bytes per token.
"$BIN" plan "$CONFIG" --engine sglang --tp 8 --gpu rtx-pro-6000 --kv-cache-dtype bf16,fp8_e4m3 --json > "$TMP/plan.json"
check "plan qwen3.5 tp8" 0 $?
[ "$(json "$TMP/plan.json" "d['rows'][0]['cell_bytes_per_token_per_gpu']")" = 15360 ] || fail "bf16 bytes/token"
[ "$(json "$TMP/plan.json" "d['rows'][1]['cell_bytes_per_token_per_gpu']")" = 7680 ] || fail "fp8 bytes/token"
"$BIN" plan "$CONFIG" --tp 8 --gpu rtx-pro-6000 --explain --html "$TMP/plan.html" > "$TMP/plan.txt"
check "plan --explain --html" 0 $?
grep -q "replicated" "$TMP/plan.txt" || fail "--explain shows no head replication"
grep -q "<svg" "$TMP/plan.html" || fail "html has no chart"

# plan --from-log on the two-launch journal (latest = BF16 launch).
"$BIN" plan "$CONFIG" --from-log "$FIX/journal_qwen35_fp8_then_bf16.log" --json > "$TMP/fromlog.json"
check "plan --from-log journal" 0 $?
[ "$(json "$TMP/fromlog.json" "all(c['inside'] for c in d['from_log']['checks'])")" = True ] || fail "from-log checks"

# plan --from-log on a real SGLang log (sgl-project/sglang PR #13023): the printed
# max_total_num_tokens inside the interval the printed GiB rounding allows.
"$BIN" plan "$SRC/tests/logs/configs/llama-3.1-8b/config.json" --from-log "$FIX/sglang_llama8b_single_gpu.log" \
  --gpu L40S --json > "$TMP/llama.json"
check "plan --from-log real sglang log" 0 $?
[ "$(json "$TMP/llama.json" "[c['inside'] for c in d['from_log']['checks']]")" = "[True, True]" ] || fail "llama from-log"

# logs: latest launch is BF16 and passes the expectation; the FP8 one fails it.
"$BIN" logs "$FIX/journal_qwen35_fp8_then_bf16.log" --expect kv_cache_dtype=bf16 --json > "$TMP/logs.json"
check "logs --expect kv_cache_dtype=bf16" 0 $?
[ "$(json "$TMP/logs.json" "d['launches'][-1]['kv_cache_dtype_resolved']")" = bf16 ] || fail "latest launch dtype"
"$BIN" logs "$FIX/journal_qwen35_fp8_then_bf16.log" --launch 1 --expect kv_cache_dtype=bf16 -q > /dev/null
check "logs --launch 1 fails the bf16 expectation" 1 $?
"$BIN" logs "$FIX/journal_qwen35_fp8_then_bf16.log" --all --json > "$TMP/all.json"
check "logs --all" 0 $?
[ "$(json "$TMP/all.json" "len(d['launches'])")" = 2 ] || fail "--all launches"
cat "$FIX/journal_qwen35_fp8_then_bf16.log" | "$BIN" logs - -q > /dev/null
check "logs from stdin" 0 $?
"$BIN" logs "$FIX/journal_qwen35_fp8_then_bf16.log" --expect colour=blue > /dev/null 2>&1
check "logs --expect unknown key" 2 $?

# With the checkpoint the launch served (the demo checkpoint: FP8 KV declared, no
# scales), the FP8 launch's scale-1.0 fallback is proven and check agrees on the dtype.
# (The build's shared copy, made once for every test that needs it.)
# Under ASan+UBSan the demo's 371444-tensor header costs ~15 s; check_cli parses it there,
# and this cross-check runs in the release build (tests/logs covers the code under ASan).
if grep -q "KVAUDIT_SANITIZE:BOOL=ON" "$BUILD/CMakeCache.txt" 2>/dev/null; then
  echo "skip checkpoint cross-check under the sanitizers (release build runs it)"
elif [ -x "$BUILD/kvaudit_make_checkpoint" ]; then
  ckpt=$("$SRC/tools/ensure-demo-checkpoint.sh" "$BUILD") || { echo "FAIL demo checkpoint"; exit 1; }
  "$BIN" logs "$FIX/journal_qwen35_fp8_then_bf16.log" --launch 1 --checkpoint "$ckpt" \
    --expect kv_cache_dtype=fp8_e4m3 --expect scale_fallback=true --json > "$TMP/fp8.json"
  check "logs --launch 1 --checkpoint: scale fallback proven" 0 $?
  json "$TMP/fp8.json" "[f['id'] for f in d['findings']]" | grep -q "check-agrees" || fail "no check-agrees"
  json "$TMP/fp8.json" "[f['id'] for f in d['findings']]" | grep -q "fp8-unit-scale" || fail "no fp8-unit-scale"
else
  echo "skip checkpoint cross-check: $BUILD/kvaudit_make_checkpoint not built"
fi
"$BIN" logs "$FIX/journal_qwen35_fp8_then_bf16.log" --launch 1 --expect scale_fallback=null -q > /dev/null
check "logs --launch 1 without checkpoint: scale_fallback null" 0 $?

# Bad input: one line on stderr, exit 2, nothing on stdout.
: > "$TMP/empty.log"
"$BIN" logs "$TMP/empty.log" > "$TMP/out" 2> "$TMP/err"
check "empty log" 2 $?
head -c 200000 /dev/urandom > "$TMP/garbage.bin"
"$BIN" logs "$TMP/garbage.bin" > "$TMP/out" 2> "$TMP/err"
check "binary garbage" 2 $?
[ "$(wc -l < "$TMP/err")" = 1 ] || fail "garbage: stderr is not one line"
[ -s "$TMP/out" ] && fail "garbage: partial output"
"$BIN" logs "$TMP/does-not-exist.log" > /dev/null 2>&1
check "missing file" 2 $?
"$BIN" logs "$TMP" > /dev/null 2>&1
check "directory" 2 $?
printf '[2026-03-07 14:02:19] server_args=ServerArgs(model_path='"'"'/m'"'"', tp_size=8, kv_cache_dtype='"'"'fp8_e4\n' > "$TMP/trunc.log"
"$BIN" logs "$TMP/trunc.log" --json > "$TMP/trunc.json"
check "truncated ServerArgs" 0 $?
[ "$(json "$TMP/trunc.json" "d['launches'][0]['server_args_complete']")" = False ] || fail "truncated flag"
[ "$(json "$TMP/trunc.json" "d['launches'][0]['kv_cache_dtype_requested']")" = None ] || fail "half value kept"
echo "no engine here" > "$TMP/plain.log"
"$BIN" logs "$TMP/plain.log" > /dev/null 2>&1
check "log without launches" 2 $?
"$BIN" plan "$CONFIG" --gpu tpu-v9 > /dev/null 2>&1
check "plan unknown gpu" 2 $?
finish plan_logs_cli
