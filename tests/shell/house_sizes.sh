#!/usr/bin/env bash
# The house's size limits as policy: every source file under 600 lines, every function under 120
# (tools/house-sizes.sh), and the script itself catches an oversized file and function.
source "$(dirname "$0")/lib.bash" "$@"

if out=$("$root/tools/house-sizes.sh" "$root" 2>&1); then pass; else fail "over the limits:
$out"; fi

# The guard must fail when a limit is crossed: a copy of src/util with one file grown past 600
# lines and one function past 120.
mkdir -p "$work/tree/src/util"
cp "$root"/src/util/*.cpp "$root"/src/util/*.h "$work/tree/src/util/"
{
  echo 'namespace kvaudit {'
  echo 'int grown_function(int x) {'
  for i in $(seq 1 130); do echo "  x += $i;"; done
  echo '  return x;'
  echo '}'
  for i in $(seq 1 500); do echo "// padding line $i"; done
  echo '}  // namespace kvaudit'
} > "$work/tree/src/util/grown.cpp"
if out=$("$root/tools/house-sizes.sh" "$work/tree" 2>&1); then
  fail "house-sizes.sh passed a tree with a 640-line file and a 133-line function"
else
  grep -q '^file src/util/grown.cpp: 6[0-9][0-9] lines' <<< "$out" && pass ||
    fail "the grown file is not named: $out"
  grep -q '^function grown_function (src/util/grown.cpp:2): 133 lines' <<< "$out" && pass ||
    fail "the grown function is not named: $out"
fi

finish house_sizes
