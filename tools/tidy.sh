#!/usr/bin/env bash
# clang-tidy over src/ with the repository's .clang-tidy (bugprone, performance and a
# readability subset; warnings are errors). `make tidy` runs it with --all, `make test` in
# its changed-files mode.
#
# The compile database is a configure-only tree without unity batches or the precompiled
# header (BUILD, default build-tidy, configured here when missing): the release build's
# database hides per-file problems, such as a .cpp that uses a header only another file of
# its unity batch included.
#
# Changed-files mode (the default) checks the src/ .cpp files changed since the commit named
# in .tidy-baseline (the last commit at which tidy was clean), uncommitted and untracked
# changes included, plus every .cpp of a module (src/<module>/) whose headers changed. A
# changed .clang-tidy, or a baseline not in the history (a shallow clone), checks every file.
# On 2 cores --all takes about 15 minutes (149 files, each parsing its third-party headers:
# three release builds' worth); the changed files of one piece of work take seconds, and a
# changed header of the largest module (engines/, 18 files) about two minutes.
#
# Prints "tidy: N files checked (changed since SHA | all), M findings, S s"; exits non-zero
# on any finding or when clang-tidy fails on a file.
# Usage: tools/tidy.sh [--all] [BUILD]      (JOBS: parallel clang-tidy runs, default nproc)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
all=0
build=""
for arg in "$@"; do
  case $arg in
    --all) all=1 ;;
    -*) echo "tidy: unknown option '$arg' (usage: tools/tidy.sh [--all] [BUILD])" >&2; exit 2 ;;
    *) [[ -z $build ]] || { echo "tidy: one BUILD folder only" >&2; exit 2; }; build=$arg ;;
  esac
done
build=${build:-build-tidy}
jobs=${JOBS:-$(nproc)}
tidy=${CLANG_TIDY:-clang-tidy}
command -v "$tidy" > /dev/null ||
  { echo "tidy: $tidy not found (tools/install-deps.sh --full installs it)" >&2; exit 2; }
start=$SECONDS

# What to check: every src/ .cpp, or those the baseline's diff reaches.
scope=all
if ((all == 0)); then
  baseline=$(grep -v '^#' .tidy-baseline 2> /dev/null | tr -d '[:space:]' || true)
  if [[ -z $baseline ]] || ! git cat-file -e "$baseline^{commit}" 2> /dev/null; then
    echo "tidy: baseline '${baseline:-none}' from .tidy-baseline is not in this history" \
      "(a shallow clone?): checking every file" >&2
    all=1
  elif [[ -n $(git diff --name-only "$baseline" -- .clang-tidy) ]]; then
    echo "tidy: .clang-tidy changed since the baseline: checking every file" >&2
    all=1
  else
    scope="changed since $(git rev-parse --short "$baseline")"
  fi
fi
if ((all)); then
  mapfile -t files < <(find src -name '*.cpp' | sort)
else
  # Committed, staged and unstaged changes against the baseline, and new untracked files.
  mapfile -t changed < <({ git diff --name-only "$baseline" -- src
                           git ls-files --others --exclude-standard -- src; } | sort -u)
  declare -A pick=()
  for f in "${changed[@]}"; do
    [[ -f $f ]] || continue  # deleted or renamed away
    case $f in
      *.cpp) pick[$f]=1 ;;
      src/*/*.h)
        module=${f#src/}; module=${module%%/*}
        while IFS= read -r cpp; do pick[$cpp]=1; done < <(find "src/$module" -name '*.cpp')
        ;;
    esac
  done
  mapfile -t files < <(printf '%s\n' "${!pick[@]}" | grep . | sort || true)
fi

findings=0
status=0
if ((${#files[@]} > 0)); then
  # The database lists the files of the last configure (src/ is globbed): configure again
  # when it is missing or a file to check is new.
  db=$build/compile_commands.json
  configure=0
  if [[ ! -f $db ]]; then
    configure=1
  else
    for f in "${files[@]}"; do
      grep -qF "\"$root/$f\"" "$db" || { configure=1; break; }
    done
  fi
  if ((configure)); then
    echo "tidy: configuring $build (no unity batches, no precompiled header)" >&2
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVAUDIT_UNITY=OFF -DKVAUDIT_PCH=OFF \
      -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DCMAKE_CXX_COMPILER=clang++-14 > /dev/null
  fi
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
  # One log and exit code per file (parallel runs must not interleave their output).
  # shellcheck disable=SC2016  # $1..$4 are the inner shell's arguments
  printf '%s\n' "${files[@]}" | xargs -d '\n' -P "$jobs" -I{} sh -c \
    'log=$3/$(printf %s "$2" | tr / _); "$4" -p "$1" --quiet "$2" > "$log" 2>&1; echo $? > "$log.rc"' \
    _ "$build" {} "$out" "$tidy"
  # A header's finding shows once per file that includes it: print and count it once.
  # A diagnostic is its "path:line:col: warning|error: ... [check]" line with the notes
  # and source lines that follow it.
  for f in "${files[@]}"; do
    log=$out/$(printf %s "$f" | tr / _)
    grep -vE '^[0-9]+ warnings? (and [0-9]+ errors? )?generated\.$|^Suppressed [0-9]+ warnings|^Use -header-filter|^[0-9]+ warnings? treated as errors$|^Error while processing ' \
      "$log" || true
  done | awk -v count="$out/count" '
    /^[^ ]+:[0-9]+:[0-9]+: (warning|error): / { show = !seen[$0]++; if (show) n++ }
    show { print }
    END { print n + 0 > count }'
  findings=$(< "$out/count")
  for f in "${files[@]}"; do
    log=$out/$(printf %s "$f" | tr / _)
    if [[ $(< "$log.rc") != 0 ]]; then
      status=1
      # A failure without a diagnostic (a crash, a missing database entry) counts as one.
      if ! grep -qE '^[^ ]+:[0-9]+:[0-9]+: (warning|error): ' "$log"; then
        echo "tidy: clang-tidy failed on $f:" >&2
        cat "$log" >&2
        findings=$((findings + 1))
      fi
    fi
  done
fi
((findings == 0)) || status=1
echo "tidy: ${#files[@]} files checked ($scope), $findings findings, $((SECONDS - start)) s"
exit $status
