#!/usr/bin/env bash
# Streams a generated 1 GiB journal through kvaudit logs and compares with
# `grep -c -E` on the same file with the same patterns; then a 2 GiB log for peak RSS.
# usage: tools/bench-logs.sh [BUILD_DIR]
# Files go to $BENCH_DIR (default /tmp; BENCH_DIR=/dev/shm keeps them in RAM when the
# disk is short), never into the repo, and are removed at the end.
set -eu
BUILD=${1:-build}
cmake --build "$BUILD" --target benchmarks > /dev/null  # not part of the default build
BENCH="$BUILD/bench/bench_logs"
BIN="$BUILD/kvaudit"
DIR=${BENCH_DIR:-/tmp}
ONE=$DIR/kvaudit-bench-1g.log
TWO=$DIR/kvaudit-bench-2g.log
trap 'rm -f "$ONE" "$ONE.patterns" "$TWO" "$TWO.patterns"' EXIT
[ -s "$ONE" ] || "$BENCH" --generate "$ONE" 1G
echo "== in-process: logs::scan_log_file vs grep -c -E, same patterns, same file (best of 3)"
"$BENCH" "$ONE" 3 || true
echo "== end to end: kvaudit logs (scan + report) vs grep -c -E"
t0=$(date +%s.%N); "$BIN" logs "$ONE" -q > /dev/null; t1=$(date +%s.%N)
count=$(LC_ALL=C grep -c -E -f "$ONE.patterns" "$ONE"); t2=$(date +%s.%N)
python3 -c "import sys; a=float(sys.argv[2])-float(sys.argv[1]); b=float(sys.argv[3])-float(sys.argv[2]); print(f'kvaudit logs {a:.3f} s, grep -c -E {b:.3f} s ({sys.argv[4]} lines), ratio {a/b:.2f}x')" "$t0" "$t1" "$t2" "$count"
echo "== peak RSS on a 2 GiB log"
[ -s "$TWO" ] || "$BENCH" --generate "$TWO" 2G
ls -l "$TWO"
/usr/bin/time -v "$BIN" logs "$TWO" -q 2>&1 | grep -E "Verdict|Maximum resident set size|Elapsed" || true
