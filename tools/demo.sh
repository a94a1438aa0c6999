#!/usr/bin/env bash
# make demo: the motivating question answered in one run, on the bundled example.
#  1. kvaudit check on the motivating checkpoint (sparse, headers only) with the deployment's
#     systemd unit and its journal, under its user's stance ("context should use no
#     quantization": --kv-policy lossless): the FP8-at-scale-1.0 finding with the evidence it
#     rests on, the decision table sized
#     from the memory the journal printed, the corrected unit written beside the original.
#  2. the unit diff: only --kv-cache-dtype changed.
#  3. after the restart: the verification the report printed, run on the journal, whose
#     second launch is the fixed unit's (passes) and whose first is the old one (fails).
# Runs from the repository root with relative paths, so its output is the README's.
set -euo pipefail
kvaudit=${1:-build/kvaudit}
root=$(cd "$(dirname "$0")/.." && pwd)
kvaudit=$(cd "$(dirname "$kvaudit")" && pwd)/$(basename "$kvaudit")
build=$(dirname "$kvaudit")
cd "$root"
build=$(realpath --relative-to="$root" "$build")
"$root/tools/ensure-demo-checkpoint.sh" "$build" > /dev/null
example=examples/qwen3.5-397b-a17b-nvfp4
journal=tests/fixtures/logs/journal_qwen35_fp8_then_bf16.log
fixed=$build/sglang.fixed.service
rm -f "$fixed"

show() { echo "\$ kvaudit ${*:2}" | sed "s|$build/kvaudit|kvaudit|"; }
args=(check "$build/demo-checkpoint" --unit "$example/sglang.service" --from-log "$journal"
      --kv-policy lossless --write-unit "$fixed" --html "$build/demo-report.html")
show "$kvaudit" "${args[@]}"
status=0
"$kvaudit" "${args[@]}" || status=$?
if [[ $status -ne 1 ]]; then
  echo "demo: expected kvaudit check to report the critical FP8-without-scales finding (exit 1), got exit $status" >&2
  exit 1
fi
echo "(exit 1: check gates deploys on critical findings; HTML report: $build/demo-report.html)"
echo
echo "\$ diff -u $example/sglang.service $fixed"
diff -u --label "$example/sglang.service" --label "$fixed" "$example/sglang.service" "$fixed" || true
echo

# The verification step, with the expectations the decision table predicted for the fix.
mapfile -t expect < <("$kvaudit" check "$build/demo-checkpoint" --unit "$example/sglang.service" \
  --from-log "$journal" --kv-policy lossless --json --fail-on never |
  python3 -c 'import json,sys
d=json.load(sys.stdin)["decision"]
fix=[o for o in d["options"] if o["id"]==d["recommended"]][0]
print("\n".join("--expect=" + e for e in fix["expect"]))')
echo "After the restart (the journal's launch 2 is the fixed unit's, launch 1 the old one):"
echo "\$ kvaudit logs $journal ${expect[*]} --quiet"
"$kvaudit" logs "$journal" "${expect[@]}" --quiet
echo "\$ kvaudit logs $journal --launch 1 ${expect[*]} --quiet"
status=0
"$kvaudit" logs "$journal" --launch 1 "${expect[@]}" --quiet || status=$?
if [[ $status -ne 1 ]]; then
  echo "demo: the old launch should fail the fix's expectations (exit 1), got exit $status" >&2
  exit 1
fi
echo "(exit 1: the old launch does not meet them)"
