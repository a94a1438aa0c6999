#!/usr/bin/env bash
# Lists source files of MAX_FILE_LINES (600) lines or more and functions of MAX_FUNCTION_LINES
# (120) or more
# under src/, largest first; exits 1 when there is any. Function extents come from
# universal-ctags (its C++ parser's end lines). A file may stay over the limit only when
# tools/house-sizes.allow names it with the reason on the same line ("PATH: why"); it is
# still listed, as allowed. Usage: tools/house-sizes.sh [ROOT]
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
max_file=${MAX_FILE_LINES:-600}
max_function=${MAX_FUNCTION_LINES:-120}
cd "$root"
status=0
allowed() { [[ -f tools/house-sizes.allow ]] && grep -q "^$1: " tools/house-sizes.allow; }
while read -r lines file; do
  [[ $file == total ]] && continue
  (( lines >= max_file )) || continue
  if allowed "$file"; then
    echo "file $file: $lines lines (>= $max_file), allowed: $(grep "^$file: " tools/house-sizes.allow | cut -d' ' -f2-)"
  else
    echo "file $file: $lines lines (>= $max_file)"
    status=1
  fi
done < <(find src -name '*.cpp' -o -name '*.h' | sort | xargs wc -l | sort -rn)
while IFS=$'\t' read -r lines where name; do
  echo "function $name ($where): $lines lines (>= $max_function)"; status=1
done < <(ctags --output-format=json --fields=+ne --c++-kinds=f --sort=no -R src | python3 -c '
import json, sys
limit = int(sys.argv[1])
rows = []
for line in sys.stdin:
    tag = json.loads(line)
    if "end" in tag and tag["end"] - tag["line"] + 1 >= limit:
        rows.append((tag["end"] - tag["line"] + 1, "%s:%d" % (tag["path"], tag["line"]), tag["name"]))
for lines, where, name in sorted(rows, reverse=True):
    print(f"{lines}\t{where}\t{name}")
' "$max_function")
exit $status
