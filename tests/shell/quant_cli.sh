#!/usr/bin/env bash
# kvaudit quant from the command line: a small synthetic run in every output mode, and the
# exit codes for bad input (2, one line on stderr, no output file).
source "$(dirname "$0")/lib.bash" "$@"
KVAUDIT=$kvaudit
BUILD=$build

args=(quant --formats fp8_e4m3:none,fp8_e4m3:tensor,int4:kivi --synthetic outlier-keys
      --ctx 512,1k --kv-heads 2 --q-heads 4 --head-dim 64 --queries 2 --threads 2)
"$KVAUDIT" "${args[@]}" > "$work/out.txt" || fail "terminal run exited $?"
grep -q "What each format does" "$work/out.txt" || fail "no tensor table"
grep -q "Attention error vs context" "$work/out.txt" || fail "no attention table"
grep -q "flushed to zero" "$work/out.txt" || fail "verdict does not name the flush"

"$KVAUDIT" "${args[@]}" --json > "$work/out.json" || fail "--json exited $?"
/usr/bin/python3 - "$work/out.json" <<'PY' || fail "JSON content"
import json, sys
r = json.load(open(sys.argv[1]))
tensors = {(t["format"], t["tensor"]): t for t in r["tensors"]}
assert tensors[("fp8_e4m3:none", "V")]["flushed_to_zero"] > 0
assert tensors[("fp8_e4m3:tensor", "K")]["saturated"] == 0
assert len(r["attention"]) == 6
PY

"$KVAUDIT" "${args[@]}" --html "$work/report.html" > /dev/null || fail "--html exited $?"
[ -s "$work/report.html" ] || fail "no HTML written"

expect_input_error() {
  local name="$1"; shift
  "$KVAUDIT" "$@" > "$work/stdout" 2> "$work/stderr"
  local code=$?
  [ "$code" -eq 2 ] || fail "$name: exit $code, expected 2"
  [ "$(wc -l < "$work/stderr")" -eq 1 ] || fail "$name: stderr is not one line: $(cat "$work/stderr")"
}
expect_input_error "bad format" quant --formats fp8_e9 --synthetic gaussian --ctx 128
expect_input_error "no source" quant --formats bf16 --ctx 128
expect_input_error "two sources" quant --formats bf16 --synthetic gaussian --input x.safetensors
expect_input_error "missing file" quant --formats bf16 --input "$work/missing.safetensors"
expect_input_error "bad profile" quant --formats bf16 --synthetic wobbly --ctx 128
expect_input_error "bad ctx" quant --formats bf16 --synthetic gaussian --ctx 12q
printf 'not a safetensors file' > "$work/junk.safetensors"
expect_input_error "junk file" quant --formats bf16 --input "$work/junk.safetensors" \
  --html "$work/junk.html"
[ ! -e "$work/junk.html" ] || fail "partial HTML written on error"
finish quant_cli
