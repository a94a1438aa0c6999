#!/usr/bin/env bash
# make demo: build the motivating checkpoint (sparse, headers only) and audit it the
# way the engineer in the motivating deployment should have: SGLang, TP 8.
set -euo pipefail
kvaudit=${1:-build/kvaudit}
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(dirname "$kvaudit")
example=$root/examples/qwen3.5-397b-a17b-nvfp4
generated=$("$root/tools/ensure-demo-checkpoint.sh" "$build")
echo "\$ kvaudit check build/demo-checkpoint --engine sglang --tp 8 --html $build/demo-report.html"
status=0
"$kvaudit" check "$generated" --engine sglang --tp 8 --html "$build/demo-report.html" || status=$?
echo
if [[ $status -eq 1 ]]; then
  echo "(exit 1: kvaudit check gates deploys on critical findings; this one is the motivating FP8-without-scales case)"
  echo "HTML report: $build/demo-report.html"
  echo
  echo "\$ kvaudit check ... --unit examples/qwen3.5-397b-a17b-nvfp4/sglang.service --kv-cache-dtype bf16 --quiet"
  "$kvaudit" check "$generated" --unit "$example/sglang.service" --kv-cache-dtype bf16 --quiet
  exit 0
fi
echo "demo: expected kvaudit check to report the critical FP8-without-scales finding (exit 1), got exit $status" >&2
exit 1
