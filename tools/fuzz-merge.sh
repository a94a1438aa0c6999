#!/usr/bin/env bash
# Moves what a fuzz campaign found into the committed corpora: for each target with a
# folder in CAMPAIGN_DIR (tools/run-fuzz.sh with FUZZ_CORPUS_DIR), libFuzzer's -merge=1
# adds to fuzz/corpus/NAME only the inputs that reach coverage the corpus lacks, the
# smallest input for each new feature. The committed inputs are all kept (many are cut from
# real logs and answers). --minimize instead rewrites fuzz/corpus/NAME as the smallest set
# of committed and campaign inputs that keeps the coverage of both.
# Every crash input the campaign saved (CAMPAIGN_DIR/artifacts/) is listed: fix it, then
# commit it to the corpus as its regression input.
# Usage: tools/fuzz-merge.sh BUILD_DIR CAMPAIGN_DIR [--minimize]
set -euo pipefail
build=${1:?usage: tools/fuzz-merge.sh BUILD_DIR CAMPAIGN_DIR [--minimize]}
campaign=${2:?usage: tools/fuzz-merge.sh BUILD_DIR CAMPAIGN_DIR [--minimize]}
minimize=0
[[ ${3:-} == --minimize ]] && minimize=1
root=$(cd "$(dirname "$0")/.." && pwd)
[[ -d /dev/shm && -w /dev/shm ]] && export TMPDIR=${TMPDIR:-/dev/shm}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
for found in "$campaign"/*/; do
  name=$(basename "$found")
  [[ $name == artifacts ]] && continue
  target=$build/fuzz/fuzz_$name
  if [[ ! -x $target ]]; then
    echo "fuzz-merge: $name: no target $target, skipped" >&2
    continue
  fi
  corpus=$root/fuzz/corpus/$name
  mkdir -p "$corpus"
  before=$(find "$corpus" -type f | wc -l)
  if ((minimize)); then
    into=$work/$name; mkdir -p "$into"
    "$target" -merge=1 -use_counters=0 -rss_limit_mb=2048 -timeout=10 "$into" "$corpus" "$found" \
      > "$work/$name.log" 2>&1 || { tail -20 "$work/$name.log"; status=1; continue; }
    find "$corpus" -type f -delete
    cp "$into"/* "$corpus"/ 2> /dev/null || true
  else
    "$target" -merge=1 -use_counters=0 -rss_limit_mb=2048 -timeout=10 "$corpus" "$found" \
      > "$work/$name.log" 2>&1 || { tail -20 "$work/$name.log"; status=1; continue; }
  fi
  after=$(find "$corpus" -type f | wc -l)
  echo "fuzz-merge: $name: $before -> $after inputs ($(du -sh "$corpus" | cut -f1))"
done
if compgen -G "$campaign/artifacts/*" > /dev/null; then
  echo "fuzz-merge: crash inputs to fix (each becomes a regression input in fuzz/corpus/):"
  ls -l "$campaign"/artifacts/
  status=1
fi
exit $status
