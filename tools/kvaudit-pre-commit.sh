#!/usr/bin/env bash
# The kvaudit-check pre-commit hook (.pre-commit-hooks.yaml): `kvaudit check --launch-from` on
# each file pre-commit passes (units, Kubernetes manifests, compose files), the way a deploy
# would be gated (--fail-on critical). YAML that launches no engine is skipped. Prints the
# verdict of each file that fails; exits with the worst exit code (1: a critical finding, 2: a
# launch or checkpoint kvaudit cannot read).
# usage: kvaudit-pre-commit.sh [CHECK_ARGS... --] FILE...
#   CHECK_ARGS go to `kvaudit check` before --launch-from: the checkpoint (a folder or org/model) and
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
  out=$("$kvaudit" check "${check_args[@]}" "${gate[@]}" --launch-from "$unit" --quiet --no-color 2>&1)
  status=$?
  # A YAML file of the repository that starts no engine (CI config, a values file) is not a
  # launch: kvaudit says so in its one line, and the hook lets it pass.
  if ((status == 2)) && [[ $out == *"no launch of a known engine"* && $unit != *.service ]]; then
    continue
  fi
  if ((status != 0)); then
    echo "$unit: $out"
    ((status > worst)) && worst=$status
  fi
done
exit "$worst"
