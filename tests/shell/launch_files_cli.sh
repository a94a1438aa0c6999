#!/usr/bin/env bash
# kvaudit check --launch-from end to end: the motivating deployment as a Kubernetes
# Deployment, a helm-rendered manifest, a compose file and SGLang's --config file gives the
# systemd unit's verdict, with evidence at the file and line of the launch; --write-unit
# writes each file with only the KV dtype setting changed; bad files get one line, exit 2.
source "$(dirname "$0")/lib.bash" "$@"

demo=$("$root/tools/ensure-demo-checkpoint.sh" "$build") || exit 1
deploy=examples/qwen3.5-397b-a17b-nvfp4/deploy
cd "$root" || exit 1

verdict_of() { grep -E '^Verdict' <<< "$1"; }
unit_out=$("$kvaudit" check "$demo" --launch-from examples/qwen3.5-397b-a17b-nvfp4/sglang.service \
  --kv-policy lossless --no-color --quiet); unit_status=$?
[[ $unit_status -eq 1 ]] && pass || fail "unit exit $unit_status, expected 1"

# (The sanitizer run skips this script: see ASAN_EXCLUDE in the Makefile.)
forms=("$deploy/kubernetes-deployment.yaml" "$deploy/helm-rendered.yaml" "$deploy/compose.yaml"
       "$deploy/sglang-config.yaml")
for form in "${forms[@]}"; do
  engine=(); [[ $form == *sglang-config.yaml ]] && engine=(--engine sglang)
  out=$("$kvaudit" check "$demo" --launch-from "$form" "${engine[@]}" --kv-policy lossless \
    --no-color --quiet); status=$?
  [[ $status -eq $unit_status ]] && pass || fail "$form exit $status, the unit's $unit_status"
  [[ "$(verdict_of "$out")" == "$(verdict_of "$unit_out")" ]] && pass \
    || fail "$form verdict '$(verdict_of "$out")' is not the unit's '$(verdict_of "$unit_out")'"
  json=$("$kvaudit" check "$demo" --launch-from "$form" "${engine[@]}" --kv-policy lossless --json)
  /usr/bin/python3 - "$json" "$form" <<'PY' && pass || fail "$form: evidence does not point at the launch"
import json, sys
doc, form = json.loads(sys.argv[1]), sys.argv[2]
unit = [f for f in doc["findings"] if f["id"] == "fp8-unit-scale"]
assert unit, [f["id"] for f in doc["findings"]]
sited = [e for e in unit[0]["evidence"] if e.get("line")]
assert sited and sited[0]["file"] == form, unit[0]["evidence"]
text = open(form).read().split("\n")
assert 1 <= sited[0]["line"] <= len(text), sited[0]
PY
  fixed="$work/$(basename "$form").fixed"
  "$kvaudit" check "$demo" --launch-from "$form" "${engine[@]}" --kv-policy lossless \
    --write-unit "$fixed" > /dev/null
  # The corrected file: the original plus the flag (or key), nothing else.
  changed=$(diff <(tr -s ' \n' '\n\n' < "$form") <(tr -s ' \n' '\n\n' < "$fixed") | grep -E '^[<>]')
  grep -qE '^> .*kv-cache-dtype' <<< "$changed" && pass || fail "$form: no KV dtype in the fix: $changed"
  ! grep -qE '^<' <<< "$changed" && pass || fail "$form: the fix removed words: $changed"
  [[ $(grep -cE '^>' <<< "$changed") -le 2 ]] && pass || fail "$form: the fix added more: $changed"
  out=$("$kvaudit" check "$demo" --launch-from "$fixed" "${engine[@]}" --kv-policy lossless --no-color --quiet)
  [[ $? -eq 0 ]] && pass || fail "$form: the corrected file still fails: $out"
done

# A file that runs no engine, a template, a missing file: one line naming it, exit 2.
printf 'apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: web\n    image: nginx\n' > "$work/pod.yaml"
printf 'kind: Deployment\nmetadata:\n  name: {{ .Values.name }}\n' > "$work/template.yaml"
for bad in "$work/pod.yaml" "$work/template.yaml" "$work/missing.yaml"; do
  err=$("$kvaudit" check "$demo" --launch-from "$bad" 2>&1 >/dev/null); status=$?
  [[ $status -eq 2 ]] && pass || fail "$bad: exit $status, expected 2"
  [[ $(wc -l <<< "$err") -eq 1 && $err == *"$bad"* ]] && pass || fail "$bad: '$err'"
done
err=$("$kvaudit" check "$demo" --launch-from "$deploy/kubernetes-deployment.yaml" --container nope 2>&1 >/dev/null)
[[ $err == *"sglang"* && $err == *"nope"* ]] && pass || fail "--container nope: '$err'"
err=$("$kvaudit" check "$demo" --launch-from "$deploy/compose.yaml" --unit x.service 2>&1 >/dev/null)
[[ $? -eq 2 && $err == *"one launch"* ]] && pass || fail "two launches accepted: '$err'"

# A compose file holding both sides of SGLang's P/D disaggregation: different KV dtypes are a
# critical finding naming both services (the checkpoint makes `auto` FP8 on the decode side);
# the same dtype is a note, no finding.
pd="$work/pd-compose.yaml"
printf 'services:\n  prefill:\n    image: lmsysorg/sglang:v0.5.9\n    command: python3 -m sglang.launch_server --model-path %s --disaggregation-mode prefill --kv-cache-dtype bf16\n  decode:\n    image: lmsysorg/sglang:v0.5.9\n    command: python3 -m sglang.launch_server --model-path %s --disaggregation-mode decode\n' "$demo" "$demo" > "$pd"
out=$("$kvaudit" check "$demo" --launch-from "$pd" --json)
python3 - "$out" <<'PY' && pass || fail "P/D pair with two KV dtypes: $out"
import json, sys
doc = json.loads(sys.argv[1])
hits = [f for f in doc["findings"] if f["id"] == "kv-transfer-dtype-mismatch"]
assert len(hits) == 1 and hits[0]["severity"] == "critical", hits
assert "service prefill" in json.dumps(hits[0]["evidence"]) and "service decode" in json.dumps(hits[0]["evidence"])
PY
sed -i "s/ --kv-cache-dtype bf16//" "$pd"
out=$("$kvaudit" check "$demo" --launch-from "$pd" --json)
python3 - "$out" <<'PY' && pass || fail "P/D pair with one KV dtype: $out"
import json, sys
doc = json.loads(sys.argv[1])
assert not [f for f in doc["findings"] if f["id"] == "kv-transfer-dtype-mismatch"]
assert any("same KV cache dtype" in n for n in doc["notes"]), doc["notes"]
PY

finish launch_files_cli
