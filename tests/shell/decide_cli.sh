#!/usr/bin/env bash
# kvaudit check's whole answer end to end: the decision table sized from the deployment's
# journal (JSON), --write-unit (atomic, original untouched, only the dtype flag differs),
# the corrected --launch command, the verification commands, bad uses of --write-unit,
# and tools/demo.sh (what `make demo` runs) from start to end.
source "$(dirname "$0")/lib.bash" "$@"

demo=$("$root/tools/ensure-demo-checkpoint.sh" "$build") || exit 1
unit=$root/examples/qwen3.5-397b-a17b-nvfp4/sglang.service
journal=$root/tests/fixtures/logs/journal_qwen35_fp8_then_bf16.log
cp "$unit" "$work/original.service"
# The motivating deployment under its user's stance: any quantized KV cache is critical.
lossless=(--kv-policy lossless)

# One run: the table (JSON), the written unit, the fix and verify lines.
json=$("$kvaudit" check "$demo" --unit "$unit" --from-log "$journal" --context 32k,128k \
  "${lossless[@]}" --write-unit "$work/sglang.fixed.service" --json); status=$?
[[ $status -eq 1 ]] && pass || fail "check exit $status, expected 1 (the critical finding)"
/usr/bin/python3 - "$json" <<'PY' && pass || fail "decision JSON"
import json, sys
d = json.loads(sys.argv[1])["decision"]
# Under lossless no quantized option is clean: no capacity-keeping alternative.
assert d["sized"] and d["recommended"] == "bf16" and d["alternative"] == "", d
assert d["contexts"] == [32768, 131072], d["contexts"]
opts = {o["id"]: o for o in d["options"]}
bf16, launched = opts["bf16"], opts["as-launched"]
assert launched["kv_cache_dtype"] == "fp8_e4m3" and launched["critical"] >= 1
assert bf16["max_total_tokens"]["lo"] <= 1573854 <= bf16["max_total_tokens"]["hi"], bf16
assert launched["max_total_tokens"]["lo"] <= 3147708 <= launched["max_total_tokens"]["hi"]
assert [c["requests"] for c in bf16["concurrency"]] == [bf16["max_total_tokens"]["lo"] // 32768,
                                                          bf16["max_total_tokens"]["lo"] // 131072]
assert any("wrote" in line for line in d["fix"]), d["fix"]
assert d["verify"][0].startswith("journalctl -u sglang -b --no-pager | kvaudit logs - --expect kv_cache_dtype=bf16")
assert "kvaudit probe http://127.0.0.1:30000 --smoke" in d["verify"]
PY
cmp -s "$unit" "$work/original.service" && pass || fail "the original unit changed"
[[ -f $work/sglang.fixed.service ]] && pass || fail "no fixed unit written"
[[ -z $(ls "$work" | grep -v -e '^original.service$' -e '^sglang.fixed.service$') ]] \
  && pass || fail "temporary files left beside the written unit: $(ls "$work")"
# Only the dtype flag differs: taking it out gives the original back.
sed 's/ --kv-cache-dtype bf16//' "$work/sglang.fixed.service" | cmp -s - "$unit" \
  && pass || fail "the written unit differs by more than the dtype flag"
[[ $(diff "$unit" "$work/sglang.fixed.service" | grep -c '^[<>]') -eq 2 ]] \
  && pass || fail "more than one line changed"
# The written unit is clean: check exits 0 on it.
"$kvaudit" check "$demo" --unit "$work/sglang.fixed.service" "${lossless[@]}" --quiet > /dev/null \
  && pass || fail "check on the written unit is not clean"

# --launch: the corrected command line, every other byte kept.
launch='python -m sglang.launch_server --model-path /m --tp 8  --port 31000 --kv-cache-dtype=auto'
out=$("$kvaudit" check "$demo" --launch "$launch" --gpu rtx-pro-6000 "${lossless[@]}" --json); status=$?
[[ $status -eq 1 ]] && pass || fail "--launch exit $status"
/usr/bin/python3 - "$out" <<'PY' && pass || fail "--launch fix and verify"
import json, sys
d = json.loads(sys.argv[1])["decision"]
assert d["fix"] == ["python -m sglang.launch_server --model-path /m --tp 8  --port 31000 --kv-cache-dtype=bf16"], d["fix"]
assert "kvaudit probe http://127.0.0.1:31000 --smoke" in d["verify"], d["verify"]
assert d["verify"][0].startswith("<the new launch's start-up log> | kvaudit logs -")
assert all(o["max_total_tokens"] for o in d["options"] if o["possible"]), "not sized from --gpu"
PY

# Without memory: no table, a note naming the flags that size it; the fix still printed.
out=$("$kvaudit" check "$demo" --unit "$unit" --no-color); status=$?
[[ $out != *"Every KV option"* && $out == *"pass --gpu NAME"* && $out == *"--kv-cache-dtype bf16"* ]] \
  && pass || fail "unsized check output"

# Bad uses: one line, exit 2, nothing written.
err=$("$kvaudit" check "$demo" --unit "$unit" "${lossless[@]}" --write-unit "$unit" 2>&1 >/dev/null); status=$?
[[ $status -eq 2 && $err == *"original stays untouched"* && $(wc -l <<< "$err") -eq 1 ]] \
  && pass || fail "--write-unit onto the unit itself: exit $status: $err"
cmp -s "$unit" "$work/original.service" && pass || fail "the original unit changed"
err=$("$kvaudit" check "$demo" --launch "$launch" --write-unit "$work/x" 2>&1 >/dev/null); status=$?
[[ $status -eq 2 && $err == *"needs --unit"* && ! -e $work/x ]] && pass || fail "--write-unit without --unit: $status $err"
err=$("$kvaudit" check "$demo" --unit "$work/sglang.fixed.service" "${lossless[@]}" --write-unit "$work/y" 2>&1 >/dev/null); status=$?
[[ $status -eq 2 && $err == *"nothing to correct"* && ! -e $work/y ]] && pass || fail "--write-unit on a clean unit: $status $err"
err=$("$kvaudit" check "$demo" --unit "$unit" --from-log "$work/missing.log" 2>&1 >/dev/null); status=$?
[[ $status -eq 2 && $err == *"missing.log"* ]] && pass || fail "--from-log missing file: $status $err"
err=$("$kvaudit" check "$demo" --unit "$unit" --context 32q 2>&1 >/dev/null); status=$?
[[ $status -eq 2 && $err == *"--context"* ]] && pass || fail "--context 32q: $status $err"

# The demo: the whole story, exit 0, the table, the diff, the verification passing and failing.
out=$("$root/tools/demo.sh" "$kvaudit" 2>&1); status=$?
[[ $status -eq 0 ]] && pass || fail "tools/demo.sh exit $status: $(tail -3 <<< "$out")"
for needle in "Every KV option" "16-bit KV cache (the fix)" "+    --trust-remote-code --kv-cache-dtype bf16" \
    "all expectations met" "launch 1 of 2 fails 3 expectation(s)"; do
  grep -qF -- "$needle" <<< "$out" && pass || fail "demo output lacks '$needle'"
done
[[ $out != *"$root"* ]] && pass || fail "demo output shows the machine's path $root"

finish decide_cli
