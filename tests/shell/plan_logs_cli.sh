#!/usr/bin/env bash
# kvaudit plan / kvaudit logs end to end: the motivating numbers, --expect exit codes,
# and bad input (empty, binary, truncated ServerArgs, missing file) failing cleanly.
# usage: plan_logs_cli.sh KVAUDIT_BINARY SOURCE_DIR BUILD_DIR
set -u
BIN=$1
SRC=$2
BUILD=$3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
FIX="$SRC/tests/fixtures/logs"
CONFIG="$SRC/examples/qwen3.5-397b-a17b-nvfp4/config.json"
fail=0
check() {  # check NAME EXPECTED_RC ACTUAL_RC
  if [ "$2" != "$3" ]; then echo "FAIL $1: exit $3, expected $2"; fail=1; else echo "ok   $1"; fi
}
json() {  # json FILE PYTHON_EXPR -> prints the value
  /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"
}

# plan: the motivating deployment's bytes per token.
"$BIN" plan "$CONFIG" --engine sglang --tp 8 --gpu rtx-pro-6000 --kv-cache-dtype bf16,fp8_e4m3 --json > "$TMP/plan.json"
check "plan qwen3.5 tp8" 0 $?
[ "$(json "$TMP/plan.json" "d['rows'][0]['cell_bytes_per_token_per_gpu']")" = 15360 ] || { echo "FAIL bf16 bytes/token"; fail=1; }
[ "$(json "$TMP/plan.json" "d['rows'][1]['cell_bytes_per_token_per_gpu']")" = 7680 ] || { echo "FAIL fp8 bytes/token"; fail=1; }
"$BIN" plan "$CONFIG" --tp 8 --gpu rtx-pro-6000 --explain --html "$TMP/plan.html" > "$TMP/plan.txt"
check "plan --explain --html" 0 $?
grep -q "replicated" "$TMP/plan.txt" || { echo "FAIL --explain shows no head replication"; fail=1; }
grep -q "<svg" "$TMP/plan.html" || { echo "FAIL html has no chart"; fail=1; }

# plan --from-log on the two-launch journal (latest = BF16 launch).
"$BIN" plan "$CONFIG" --from-log "$FIX/journal_qwen35_fp8_then_bf16.log" --json > "$TMP/fromlog.json"
check "plan --from-log journal" 0 $?
[ "$(json "$TMP/fromlog.json" "all(c['inside'] for c in d['from_log']['checks'])")" = True ] || { echo "FAIL from-log checks"; fail=1; }

# plan --from-log on a real SGLang log (sgl-project/sglang PR #13023): the printed
# max_total_num_tokens inside the interval the printed GiB rounding allows.
"$BIN" plan "$SRC/tests/logs/configs/llama-3.1-8b/config.json" --from-log "$FIX/sglang_llama8b_single_gpu.log" \
  --gpu L40S --json > "$TMP/llama.json"
check "plan --from-log real sglang log" 0 $?
[ "$(json "$TMP/llama.json" "[c['inside'] for c in d['from_log']['checks']]")" = "[True, True]" ] || { echo "FAIL llama from-log"; fail=1; }

# logs: latest launch is BF16 and passes the expectation; the FP8 one fails it.
"$BIN" logs "$FIX/journal_qwen35_fp8_then_bf16.log" --expect kv_cache_dtype=bf16 --json > "$TMP/logs.json"
check "logs --expect kv_cache_dtype=bf16" 0 $?
[ "$(json "$TMP/logs.json" "d['launches'][-1]['kv_cache_dtype_resolved']")" = bf16 ] || { echo "FAIL latest launch dtype"; fail=1; }
"$BIN" logs "$FIX/journal_qwen35_fp8_then_bf16.log" --launch 1 --expect kv_cache_dtype=bf16 -q > /dev/null
check "logs --launch 1 fails the bf16 expectation" 1 $?
"$BIN" logs "$FIX/journal_qwen35_fp8_then_bf16.log" --all --json > "$TMP/all.json"
check "logs --all" 0 $?
[ "$(json "$TMP/all.json" "len(d['launches'])")" = 2 ] || { echo "FAIL --all launches"; fail=1; }
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
  json "$TMP/fp8.json" "[f['id'] for f in d['findings']]" | grep -q "check-agrees" || { echo "FAIL no check-agrees"; fail=1; }
  json "$TMP/fp8.json" "[f['id'] for f in d['findings']]" | grep -q "fp8-unit-scale" || { echo "FAIL no fp8-unit-scale"; fail=1; }
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
[ "$(wc -l < "$TMP/err")" = 1 ] || { echo "FAIL garbage: stderr is not one line"; fail=1; }
[ -s "$TMP/out" ] && { echo "FAIL garbage: partial output"; fail=1; }
"$BIN" logs "$TMP/does-not-exist.log" > /dev/null 2>&1
check "missing file" 2 $?
"$BIN" logs "$TMP" > /dev/null 2>&1
check "directory" 2 $?
printf '[2026-03-07 14:02:19] server_args=ServerArgs(model_path='"'"'/m'"'"', tp_size=8, kv_cache_dtype='"'"'fp8_e4\n' > "$TMP/trunc.log"
"$BIN" logs "$TMP/trunc.log" --json > "$TMP/trunc.json"
check "truncated ServerArgs" 0 $?
[ "$(json "$TMP/trunc.json" "d['launches'][0]['server_args_complete']")" = False ] || { echo "FAIL truncated flag"; fail=1; }
[ "$(json "$TMP/trunc.json" "d['launches'][0]['kv_cache_dtype_requested']")" = None ] || { echo "FAIL half value kept"; fail=1; }
echo "no engine here" > "$TMP/plain.log"
"$BIN" logs "$TMP/plain.log" > /dev/null 2>&1
check "log without launches" 2 $?
"$BIN" plan "$CONFIG" --gpu tpu-v9 > /dev/null 2>&1
check "plan unknown gpu" 2 $?
exit $fail
