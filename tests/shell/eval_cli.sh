#!/usr/bin/env bash
# kvaudit eval end to end on the trained fixture model: JSON payload, recall grid, and
# malformed input (one line on stderr, exit 2, no partial HTML file).
source "$(dirname "$0")/lib.bash" "$@"
model=$root/tests/fixtures/model/qwen3-pystd

json=$("$kvaudit" eval --model "$model" --kv bf16 --kv fp8_e5m2 --text "$model/heldout.txt" \
  --ctx 128 --chunks 2 --recall --recall-ctx 256 --recall-depth 16 --recall-cases 1 --json \
  --html "$work/eval.html"); status=$?
[[ $status -eq 0 ]] && pass || fail "eval exit $status"
[[ -s $work/eval.html ]] && pass || fail "no HTML report"
/usr/bin/python3 - "$json" <<'PY' && pass || fail "JSON payload"
import json, sys
doc = json.loads(sys.argv[1])
ppl = doc["perplexity"]
assert ppl["chunks"] == 2 and ppl["ctx_tokens"] == 128 and ppl["first_scored"] == 64
base, test = ppl["formats"]
assert base["baseline"] and base["summary"]["kld_mean"] == 0
assert test["summary"]["count"] == 2 * 63 and test["summary"]["kld_mean"] > 0
assert test["kv_bytes_per_token"] * 2 == base["kv_bytes_per_token"]
assert len(doc["recall"]) == 2 and doc["recall"][0]["cells"][0]["depth_tokens"] == 16
PY

for args in "--kv nosuchformat --text $model/heldout.txt" "--text /nonexistent.txt" \
    "--text $model/heldout.txt --ctx 1000000" "" "--recall --recall-ctx 64 --recall-depth 64"; do
  err=$("$kvaudit" eval --model "$model" $args --html "$work/bad.html" 2>&1 >/dev/null); status=$?
  [[ $status -eq 2 ]] && pass || fail "'$args' exit $status, expected 2"
  [[ $(wc -l <<< "$err") -eq 1 && $err == kvaudit:* ]] && pass || fail "'$args' stderr: $err"
  [[ ! -e $work/bad.html ]] && pass || fail "'$args' left an HTML file"
done
err=$("$kvaudit" eval --model "$work" --text "$model/heldout.txt" 2>&1 >/dev/null); status=$?
[[ $status -eq 2 && $err == *config.json* ]] && pass || fail "missing model: exit $status, $err"

finish eval_cli
