#!/usr/bin/env bash
# --sarif and --junit end to end, each file validated against its schema: SARIF 2.1.0
# (OASIS rtm.5 copy) with Debian's python3-jsonschema, JUnit with xmllint against
# jenkins-junit.xsd. Both schemas are fetched by the ctest fixture ci_schemas
# (tools/fetch-ci-schemas.sh) into BUILD/ci-schemas. Runs: the demo's check (the gate fails,
# the files are still written), logs --expect on the demo journal with a met and an unmet
# expectation, and probe (smoke, and an A/B with --gate) against two `kvaudit serve`s of the
# fixture model on 127.0.0.1.
# usage: ci_outputs.sh KVAUDIT_BINARY SOURCE_DIR BUILD_DIR
source "$(dirname "$0")/lib.bash" "$@"
# The servers' pids go to files: start() runs in a $(...) subshell, whose array changes the
# parent never sees (the servers outlived every run before this).
at_exit 'for f in "$work"/*.pid; do [[ -f $f ]] && kill "$(cat "$f")" 2>/dev/null; done; wait'

# shellcheck source=tests/shell/ci_validate.bash
source "$root/tests/shell/ci_validate.bash"
require_validators "$build" || exit 1

cd "$root" || exit 1  # relative evidence paths, as a CI job runs in its checkout
demo=$("$root/tools/ensure-demo-checkpoint.sh" "$build") || exit 1
demo=$(realpath --relative-to="$root" "$demo")
unit=examples/qwen3.5-397b-a17b-nvfp4/sglang.service
journal=tests/fixtures/logs/journal_qwen35_fp8_then_bf16.log

# --- check on the demo: exit 1 (critical findings), both files written anyway.
"$kvaudit" check "$demo" --unit "$unit" --from-log "$journal" --kv-policy lossless \
  --sarif "$work/check.sarif" --junit "$work/check.xml" -q > /dev/null
status=$?
[[ $status -eq 1 ]] && pass || fail "demo check exit $status, expected 1"
validate_sarif "$work/check.sarif" && pass || fail "demo check SARIF"
validate_junit "$work/check.xml" && pass || fail "demo check JUnit"
# The same run again, with --json to compare against: the SARIF of two runs is the same file
# (its fingerprints are what code scanning matches alerts by).
"$kvaudit" check "$demo" --unit "$unit" --from-log "$journal" --kv-policy lossless --json \
  --sarif "$work/again.sarif" > "$work/check.json"
cmp -s "$work/check.sarif" "$work/again.sarif" && pass || fail "two runs wrote different SARIF"
version=$("$kvaudit" --version)
/usr/bin/python3 - "$work/check.sarif" "$work/check.xml" "$work/check.json" "$version" <<'PY' \
  && pass || fail "demo check: SARIF and JUnit against the JSON report"
import json, sys, xml.etree.ElementTree as ET
sarif, junit, report = json.load(open(sys.argv[1])), ET.parse(sys.argv[2]), json.load(open(sys.argv[3]))
run = sarif["runs"][0]
assert run["tool"]["driver"]["version"] == sys.argv[4].split()[1], run["tool"]["driver"]
findings = report["findings"]
ids = list(dict.fromkeys(f["id"] for f in findings))
assert [r["id"] for r in run["tool"]["driver"]["rules"]] == ids, run["tool"]["driver"]["rules"]
levels = {"critical": "error", "warning": "warning", "info": "note"}
assert [r["level"] for r in run["results"]] == [levels[f["severity"]] for f in findings]
for result, finding in zip(run["results"], findings):
    assert result["ruleId"] == finding["id"]
    assert run["tool"]["driver"]["rules"][result["ruleIndex"]]["id"] == finding["id"]
    # Every demo finding names a file (the checkpoint's config, the unit, the engine data):
    # relative to the checkout, so code scanning shows each one.
    artifact = result["locations"][0]["physicalLocation"]["artifactLocation"]
    assert artifact["uriBaseId"] == "%SRCROOT%" and not artifact["uri"].startswith("/"), artifact
unit_scale = [r for r in run["results"] if r["ruleId"] == "fp8-unit-scale"][0]
assert unit_scale["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == \
    "examples/qwen3.5-397b-a17b-nvfp4/sglang.service", unit_scale["locations"]
assert unit_scale["properties"]["basis"] == "published"
suite = junit.getroot().find("testsuite")
assert suite.get("name") == "kvaudit check"
cases = suite.findall("testcase")
assert [c.get("classname") for c in cases] == [f["id"] for f in findings]
failed = [c.get("classname") for c in cases if c.find("failure") is not None]
assert failed == [f["id"] for f in findings if f["severity"] == "critical"], failed
assert int(suite.get("failures")) == len(failed) > 0
PY

# --- logs --expect on the demo journal: one expectation met, one not (exit 1).
"$kvaudit" logs "$journal" --expect kv_cache_dtype=bf16 --expect scale_fallback=true \
  --sarif "$work/logs.sarif" --junit "$work/logs.xml" -q > /dev/null
status=$?
[[ $status -eq 1 ]] && pass || fail "logs with an unmet expectation: exit $status, expected 1"
validate_sarif "$work/logs.sarif" && pass || fail "logs SARIF"
validate_junit "$work/logs.xml" && pass || fail "logs JUnit"
/usr/bin/python3 - "$work/logs.xml" <<'PY' && pass || fail "logs JUnit expectations"
import sys, xml.etree.ElementTree as ET
suite = ET.parse(sys.argv[1]).getroot().find("testsuite")
assert suite.get("name") == "kvaudit logs"
expect = {c.get("name"): c for c in suite.findall("testcase")
          if c.get("classname") == "kvaudit.logs.expect"}
assert list(expect) == ["kv_cache_dtype=bf16", "scale_fallback=true"], list(expect)
assert expect["kv_cache_dtype=bf16"].find("failure") is None
failure = expect["scale_fallback=true"].find("failure")
assert failure.get("message") == "expected true, log says false", failure.get("message")
# logs gates on its expectations only: its findings pass, whatever their severity.
assert int(suite.get("failures")) == 1, suite.get("failures")
PY

# --- probe: smoke against one server, then an A/B of a bf16 and an fp8 server with gates.
model=$root/tests/fixtures/model/qwen3-pystd
start() {  # start NAME ARGS...: runs kvaudit serve on a free port; prints its URL
  local name=$1 url=""
  shift
  "$kvaudit" serve --model "$model" --port 0 "$@" > "$work/$name.log" 2>&1 &
  echo $! > "$work/$name.pid"
  for _ in $(seq 1 200); do
    url=$(grep -so 'http://127.0.0.1:[0-9]*' "$work/$name.log" | tail -n 1)
    [[ -n $url ]] && break
    sleep 0.1
  done
  echo "$url"
}
a_url=$(start bf16 --kv-cache-dtype bf16)
b_url=$(start fp8 --kv-cache-dtype fp8_e4m3)
if [[ -z $a_url || -z $b_url ]]; then
  fail "kvaudit serve did not start: $(tail -n 3 "$work/bf16.log" "$work/fp8.log")"
else
  "$kvaudit" probe "$b_url" --smoke --kv-policy lossless \
    --sarif "$work/probe.sarif" --junit "$work/probe.xml" -q > /dev/null
  status=$?
  [[ $status -eq 1 ]] && pass || fail "probe of the fp8 server under lossless: exit $status, expected 1"
  validate_sarif "$work/probe.sarif" && pass || fail "probe SARIF"
  validate_junit "$work/probe.xml" && pass || fail "probe JUnit"
  "$kvaudit" probe "$a_url" --compare "$b_url" --smoke --gate 'smoke_drop<=10pt,kl<=0.0001' \
    --fail-on never --sarif "$work/ab.sarif" --junit "$work/ab.xml" -q > /dev/null
  status=$?
  [[ $status -eq 1 ]] && pass || fail "A/B with a failing KL gate: exit $status, expected 1"
  validate_sarif "$work/ab.sarif" && pass || fail "A/B SARIF"
  validate_junit "$work/ab.xml" && pass || fail "A/B JUnit"
  /usr/bin/python3 - "$work/probe.sarif" "$work/probe.xml" "$work/ab.xml" <<'PY' \
    && pass || fail "probe JUnit: smoke and gate test cases"
import json, sys, xml.etree.ElementTree as ET
# Evidence that names a file (the engine data) places a result; one that names only the
# server gets a logical location that says which (probe has no input file to fall back to).
results = json.load(open(sys.argv[1]))["runs"][0]["results"]
assert results
for result in results:
    location = result["locations"][0]
    names_file = any(e.startswith("data/") for e in result["properties"]["evidence"])
    assert ("physicalLocation" in location) == names_file, result
    if not names_file:
        assert location["logicalLocations"][0]["name"], location
smoke = ET.parse(sys.argv[2]).getroot().find("testsuite")
kinds = [c.get("classname") for c in smoke.findall("testcase")]
assert kinds.count("kvaudit.probe.smoke") == 3, kinds
assert "fp8-unit-scale" in kinds, kinds
ab = ET.parse(sys.argv[3]).getroot().find("testsuite")
gates = {c.get("name"): c for c in ab.findall("testcase") if c.get("classname") == "kvaudit.probe.gate"}
assert list(gates) == ["smoke_drop<=10pt", "kl<=0.0001"], list(gates)
assert gates["smoke_drop<=10pt"].find("failure") is None
assert "exceeds the limit" in gates["kl<=0.0001"].find("failure").get("message")
# --fail-on never: the A/B's findings pass; the failed gate (and any failed smoke) fail.
assert all(c.find("failure") is None for c in ab.findall("testcase")
           if not c.get("classname").startswith("kvaudit.probe."))
PY
fi

finish ci_outputs
