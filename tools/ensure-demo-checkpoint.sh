#!/usr/bin/env bash
# Makes BUILD/demo-checkpoint (the sparse, headers-only motivating checkpoint) if it is
# missing or older than its manifest. Tests run in parallel, so the build is serialized
# with flock and written to a temporary folder that is renamed into place only when
# complete: a reader never sees half a checkpoint.
# Usage: ensure-demo-checkpoint.sh BUILD_DIR   (prints the checkpoint's path)
set -euo pipefail
build=$(cd "${1:?usage: ensure-demo-checkpoint.sh BUILD_DIR}" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
manifest=$root/examples/qwen3.5-397b-a17b-nvfp4/manifest.json
target=$build/demo-checkpoint
index=$target/model.safetensors.index.json
exec 9> "$build/.demo-checkpoint.lock"
flock 9
example=$(dirname "$manifest")
if [[ ! -f $index || $manifest -nt $index || $example/config.json -nt $index ||
      $example/hf_quant_config.json -nt $index || $build/kvaudit_make_checkpoint -nt $index ]]; then
  staging=$(mktemp -d "$build/.demo-checkpoint.XXXXXX")
  trap 'rm -rf "$staging"' EXIT
  "$build/kvaudit_make_checkpoint" "$manifest" "$staging/ckpt" > /dev/null
  rm -rf "$target"
  mv "$staging/ckpt" "$target"
fi
echo "$target"
