#!/usr/bin/env bash
# The kvaudit-check pre-commit hook (.pre-commit-hooks.yaml): `kvaudit check` on each unit
# pre-commit passes, the way a deploy would be gated (--fail-on critical). Prints the verdict
# of each unit that fails; exits with the worst exit code (1: a critical finding, 2: a unit or
# checkpoint kvaudit cannot read).
# usage: kvaudit-pre-commit.sh [CHECK_ARGS... --] UNIT...
#   CHECK_ARGS go to `kvaudit check` before --unit: the checkpoint (a folder or org/model) and
#   any flag (--engine-version V, --kv-policy P, ...). Without them, the checkpoint is the
#   unit's own --model-path.
set -uo pipefail
kvaudit=${KVAUDIT:-kvaudit}
check_args=()
for arg in "$@"; do
  if [[ $arg == -- ]]; then
    while [[ $1 != -- ]]; do check_args+=("$1"); shift; done
    shift
    break
  fi
done
if ! command -v "$kvaudit" > /dev/null; then
  echo "kvaudit-check: '$kvaudit' not found: put kvaudit on PATH (make build: build/kvaudit) or set KVAUDIT" >&2
  exit 2
fi
# The deploy gate unless the hook's args set another (--fail-on takes one value).
gate=(--fail-on critical)
for arg in "${check_args[@]}"; do [[ $arg == --fail-on* ]] && gate=(); done
worst=0
for unit in "$@"; do
  out=$("$kvaudit" check "${check_args[@]}" "${gate[@]}" --unit "$unit" --quiet --no-color 2>&1)
  status=$?
  if ((status != 0)); then
    echo "$unit: $out"
    ((status > worst)) && worst=$status
  fi
done
exit "$worst"
