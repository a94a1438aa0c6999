#!/usr/bin/env bash
# Whole-process `kvaudit check` on the 371K-tensor demo against its baseline, Python merely
# parsing the same safetensors headers with json.loads (read from the same files, in a fresh
# interpreter each time). The two run interleaved (A, B, A, B, ...) so that other work on a
# shared machine slows both alike; prints the median wall time and peak RSS of each, and the
# ratio. BEFORE=path/to/an/older/kvaudit joins the rotation (A, B, C, ...) for a before/after.
# usage: [BEFORE=KVAUDIT] tools/bench-check.sh [BUILD_DIR] [ROUNDS]
set -euo pipefail
build=${1:-build}
rounds=${2:-11}
root=$(cd "$(dirname "$0")/.." && pwd)
ckpt=$("$root/tools/ensure-demo-checkpoint.sh" "$build")
kvaudit=("$build/kvaudit" check "$ckpt" --engine sglang)
python=(/usr/bin/python3 -c '
import glob, json, struct, sys
for path in sorted(glob.glob(sys.argv[1] + "/*.safetensors")):
    with open(path, "rb") as f:
        json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
' "$ckpt")
samples=$(mktemp)
trap 'rm -f "$samples" "$samples.rss"' EXIT
# One run: "NAME WALL_S PEAK_KB"; the wall time from the shell's clock (ms resolution, where
# /usr/bin/time's %e has 10 ms), the peak RSS from /usr/bin/time.
run() {
  local name=$1
  shift
  local start end
  start=$(date +%s%N)
  /usr/bin/time -f %M -o "$samples.rss" "$@" > /dev/null || [[ $name != python ]]
  end=$(date +%s%N)
  echo "$name $(( (end - start) / 1000 )) $(cat "$samples.rss")" >> "$samples"
}
before=${BEFORE:-}
"${kvaudit[@]}" > /dev/null || true  # warm the page cache
"${python[@]}"
for (( i = 0; i < rounds; ++i )); do
  [[ -n $before ]] && run before "$before" "${kvaudit[@]:1}"
  run kvaudit "${kvaudit[@]}"
  run python "${python[@]}"
done
/usr/bin/python3 - "$samples" "$rounds" << 'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    name, wall_us, rss_kb = line.split()
    runs.setdefault(name, []).append((int(wall_us) / 1e6, int(rss_kb)))
med = {name: (statistics.median(w for w, _ in r), max(k for _, k in r)) for name, r in runs.items()}
print(f"kvaudit check demo vs python3 json.loads of its headers, {sys.argv[2]} interleaved rounds")
for name, label in (("before", "kvaudit check, BEFORE binary"),
                    ("kvaudit", "kvaudit check (whole process)"),
                    ("python", "python3 json.loads (baseline)")):
    if name not in med:
        continue
    wall, rss = med[name]
    print(f"  {label:31} median {wall * 1e3:6.1f} ms, peak RSS {rss / 1024:5.1f} MiB")
ratio = med["python"][0] / med["kvaudit"][0]
print(f"  ratio (python / kvaudit): {ratio:.1f}x  (target >= 9x; peak RSS target <= 64 MiB)")
if "before" in med:
    print(f"  ratio (before / kvaudit): {med['before'][0] / med['kvaudit'][0]:.2f}x")
EOF
