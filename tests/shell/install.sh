#!/usr/bin/env bash
# Installing kvaudit: `cmake --install` into a temporary prefix, and the .deb cpack builds
# installed by dpkg into a temporary root (--root, never the system's). Each runs `check` on
# the demo from a folder outside the source tree with KVAUDIT_DATA_DIR unset, and gives the
# build-tree binary's verdict while reading its own data. Then the data-folder rule (util.h,
# data_dir()): KVAUDIT_DATA_DIR overrides, and an empty one or a binary copied without its
# data is a one-line error (exit 2), never a silent read of the source tree.
source "$(dirname "$0")/lib.bash" "$@"
unset KVAUDIT_DATA_DIR

demo=$("$root/tools/ensure-demo-checkpoint.sh" "$build") || exit 1
unit=$root/examples/qwen3.5-397b-a17b-nvfp4/sglang.service
journal=$root/tests/fixtures/logs/journal_qwen35_fp8_then_bf16.log
# Every run starts here: nothing of the source tree is reachable by a relative path.
mkdir -p "$work/elsewhere"
cd "$work/elsewhere" || exit 1

# The demo's check (make demo's arguments) as JSON: exit status and the report.
check_demo() {  # BINARY OUT.json
  "$1" check "$demo" --unit "$unit" --from-log "$journal" --kv-policy lossless --json > "$2"
}
# The same verdict: the JSON reports equal once each run's data folder reads DATA/ and the
# checkpoint's read time is dropped; the installed run must also name its own data folder
# and never the source tree's.
same_report() {  # LABEL REFERENCE.json REFERENCE_DATA RUN.json RUN_DATA
  /usr/bin/python3 - "$@" <<'PY'
import json, sys
label, ref, ref_data, run, run_data = sys.argv[1:]
def load(path, data):
    text = open(path).read()
    assert data + "/" in text, f"{label}: {path} never names its data folder {data}"
    doc = json.loads(text.replace(data + "/", "DATA/"))
    doc["facts"].pop("read_ms", None)
    return doc
a, b = load(ref, ref_data), load(run, run_data)
assert a == b, f"{label}: the report differs from the build-tree binary's"
assert ref_data not in open(run).read() or ref_data == run_data, f"{label}: read {ref_data}"
PY
}

check_demo "$kvaudit" "$work/reference.json"; status=$?
[[ $status -eq 1 ]] && pass || fail "build-tree check of the demo: exit $status, expected 1"

# (a) cmake --install into a prefix of its own.
prefix=$work/prefix/usr
cmake --install "$build" --prefix "$prefix" > "$work/install.log" 2>&1 && pass ||
  { fail "cmake --install"; cat "$work/install.log"; }
for f in bin/kvaudit share/kvaudit/gpus.json share/kvaudit/evidence/kv_damage.json \
    share/kvaudit/engines/dtypes.json share/kvaudit/engines/sglang.json \
    share/kvaudit/engines/capacity/sglang.json share/doc/kvaudit/README.md \
    share/doc/kvaudit/docs/findings.md; do
  [[ -f $prefix/$f ]] && pass || fail "cmake --install left out $f"
done
# Every data file, and nothing from tests/, bench/ or tools/.
(cd "$root/data" && find . -type f | sort) > "$work/data.txt"
(cd "$prefix/share/kvaudit" && find . -type f | sort) > "$work/installed-data.txt"
diff "$work/data.txt" "$work/installed-data.txt" > /dev/null && pass ||
  fail "installed data differs from data/: $(diff "$work/{data,installed-data}.txt" | tr '\n' ' ')"
stray=$(cd "$prefix" && find . -type f ! -path ./bin/kvaudit ! -path './share/kvaudit/*' \
  ! -path './share/doc/kvaudit/*')
[[ -z $stray ]] && pass || fail "cmake --install installed more: $stray"
check_demo "$prefix/bin/kvaudit" "$work/installed.json"; status=$?
[[ $status -eq 1 ]] && pass || fail "installed check of the demo: exit $status, expected 1"
same_report "cmake --install" "$work/reference.json" "$root/data" "$work/installed.json" \
  "$prefix/share/kvaudit" && pass || fail "installed copy's report"

# (b) The .deb: control fields, contents, and the check from the installed package.
version=$("$kvaudit" --version | awk '{print $2}')
arch=$(dpkg --print-architecture)
deb=$work/pkg/kvaudit_${version}_${arch}.deb
cpack --config "$build/CPackConfig.cmake" -G DEB -B "$work/pkg" > "$work/cpack.log" 2>&1 &&
  [[ -f $deb ]] && pass || { fail "cpack -G DEB made no $deb"; cat "$work/cpack.log"; }
info=$(dpkg-deb -I "$deb" 2>&1)
field() { sed -n "s/^ $1: //p" <<< "$info"; }
[[ $(field Package) == kvaudit && $(field Version) == "$version" &&
   $(field Architecture) == "$arch" && $(field Section) == utils &&
   -n $(field Maintainer) && -n $(field Description) ]] && pass ||
  fail "control fields: $info"
# dpkg-shlibdeps: Depends names the C library and the shared libraries the binary links
# (OpenSSL comes in through libcpp-httplib, which the binary links, not libssl itself).
depends=$(field Depends)
for lib in libc6 libstdc++6 libfmt libcpp-httplib libyaml-cpp libpcre2-8 libutf8proc libhwy; do
  [[ $depends == *"$lib"* ]] && pass || fail "Depends lacks $lib: '$depends'"
done
listing=$(dpkg-deb -c "$deb")
grep -qE ' \./usr/bin/kvaudit$' <<< "$listing" && pass || fail "the .deb lacks usr/bin/kvaudit"
grep -qE ' \./usr/share/kvaudit/engines/sglang\.json$' <<< "$listing" &&
  grep -qE ' \./usr/share/kvaudit/engines/vllm\.json$' <<< "$listing" && pass ||
  fail "the .deb lacks usr/share/kvaudit/engines/*.json"
# A real dpkg install into a root of its own (never the system's): its database records the
# packages Depends names as this machine has them, so the install also proves Depends is met
# by them, version bounds included. No maintainer scripts run (there are none).
debroot=$work/debroot
mkdir -p "$debroot/var/lib/dpkg/info" "$debroot/var/lib/dpkg/updates"
touch "$debroot/var/lib/dpkg/status" "$debroot/var/lib/dpkg/available"
mapfile -t needed < <(sed 's/([^)]*)//g; s/[,|]/ /g' <<< "$depends" | tr -s ' ' '\n' | grep .)
dpkg-query -s "${needed[@]}" > "$debroot/var/lib/dpkg/status" 2> /dev/null
for p in $(dpkg-query -W -f='${binary:Package}\n' "${needed[@]}" 2> /dev/null); do
  touch "$debroot/var/lib/dpkg/info/$p.list"  # their (empty) file lists: no warnings
done
dpkg_root() {  # ldconfig and start-stop-daemon must be on PATH, even for a user's PATH
  PATH=$PATH:/usr/sbin:/sbin dpkg --root="$debroot" --force-not-root --force-script-chrootless "$@"
}
dpkg_root -i "$deb" > "$work/dpkg.log" 2>&1 && ! grep -qi warning "$work/dpkg.log" && pass ||
  { fail "dpkg --root -i"; cat "$work/dpkg.log"; }
file "$debroot/usr/bin/kvaudit" | grep -q ", stripped" && pass ||
  fail "packaged binary not stripped"
check_demo "$debroot/usr/bin/kvaudit" "$work/deb.json"; status=$?
[[ $status -eq 1 ]] && pass || fail "the .deb's check of the demo: exit $status, expected 1"
same_report ".deb" "$work/reference.json" "$root/data" "$work/deb.json" \
  "$debroot/usr/share/kvaudit" && pass || fail "the .deb's report"
dpkg_root -r kvaudit > "$work/dpkg.log" 2>&1 &&
  [[ -z $(find "$debroot" -type f ! -path '*/var/lib/dpkg/*') ]] && pass ||
  { fail "dpkg --root -r left files"; cat "$work/dpkg.log"; }

# (c) KVAUDIT_DATA_DIR overrides: the installed binary reads a copy of the data there (logs
# loads the engine data and takes 0.1 s where check of the demo takes seconds): the same
# answer from an intact copy, an error naming the copy's file once that file is broken. An
# empty folder is a one-line error naming it, exit 2.
logs=("$prefix/bin/kvaudit" logs "$journal" --json)
"${logs[@]}" > "$work/logs.json" 2>&1
cp -r "$prefix/share/kvaudit" "$work/override"
KVAUDIT_DATA_DIR=$work/override "${logs[@]}" > "$work/override.json" 2>&1 &&
  cmp -s "$work/logs.json" "$work/override.json" && pass ||
  fail "KVAUDIT_DATA_DIR: $(head -c 300 "$work/override.json")"
echo '{' > "$work/override/engines/sglang.json"
KVAUDIT_DATA_DIR=$work/override "${logs[@]}" > /dev/null 2> "$work/err"; status=$?
[[ $status -eq 2 ]] && grep -q "$work/override/engines/sglang.json" "$work/err" && pass ||
  fail "KVAUDIT_DATA_DIR was not read: exit $status, $(cat "$work/err")"
mkdir "$work/empty"
KVAUDIT_DATA_DIR=$work/empty "$prefix/bin/kvaudit" check "$demo" > /dev/null 2> "$work/err"
status=$?
[[ $status -eq 2 && $(wc -l < "$work/err") -eq 1 ]] &&
  grep -q "KVAUDIT_DATA_DIR=$work/empty" "$work/err" && pass ||
  fail "empty KVAUDIT_DATA_DIR: exit $status, stderr: $(cat "$work/err")"

# (d) The build's binary copied alone: no share/kvaudit beside it, and not in its build tree,
# so a one-line error naming where it looked, never the source tree's data.
mkdir -p "$work/alone/bin"
cp "$kvaudit" "$work/alone/bin/kvaudit"
"$work/alone/bin/kvaudit" check "$demo" > /dev/null 2> "$work/err"; status=$?
[[ $status -eq 2 && $(wc -l < "$work/err") -eq 1 ]] &&
  grep -q "$work/alone/share/kvaudit" "$work/err" && grep -q "KVAUDIT_DATA_DIR" "$work/err" &&
  pass || fail "a binary without its data: exit $status, stderr: $(cat "$work/err")"

finish install
