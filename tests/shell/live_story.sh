#!/usr/bin/env bash
# The motivating story end to end over loopback HTTP (what `make demo-live` runs): check,
# serve with auto -> FP8 at scale 1.0, logs, probe --compare vs BF16 (measurable divergence)
# and BF16 vs BF16 (the same), logs --expect after the fix. See tools/demo-live.sh.
set -uo pipefail
root=$2; build=$3
bash "$root/tools/demo-live.sh" "$build" > /dev/null
