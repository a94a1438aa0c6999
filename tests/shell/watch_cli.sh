#!/usr/bin/env bash
# kvaudit watch end to end: the demo's check --json gives the expectations; a journal fed
# on stdin as journalctl -f would (three launches, the third back on FP8) flips
# /metrics, which a Prometheus parser (python3-prometheus-client) reads; --once gates on
# the expectations; a rotated log file is followed; bad input gets one line and exit 2.
source "$(dirname "$0")/lib.bash" "$@"
watcher=""
at_exit '[[ -n $watcher ]] && kill "$watcher"'
cd "$root" || exit 1
demo=$("$root/tools/ensure-demo-checkpoint.sh" "$build") || exit 1
journal=tests/fixtures/logs/journal_qwen35_fp8_bf16_fp8.log

# The expectations check printed for the fix.
"$kvaudit" check "$demo" --unit examples/qwen3.5-397b-a17b-nvfp4/sglang.service \
  --kv-policy lossless --json > "$work/check.json"
[[ $? -eq 1 ]] && pass || fail "check of the demo: expected exit 1 (critical finding)"

# Reads /metrics with the reference client library's parser; prints NAME{labels} VALUE lines.
metrics() {
  curl -sf "http://127.0.0.1:$port/metrics" > "$work/metrics.txt" || return 1
  /usr/bin/python3 - "$work/metrics.txt" <<'PY'
import sys
from prometheus_client.parser import text_string_to_metric_families
for family in text_string_to_metric_families(open(sys.argv[1]).read()):
    for s in family.samples:
        labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()) if k != "source")
        print(f"{s.name}{{{labels}}} {s.value:g}")
PY
}
wait_for() {  # PATTERN: polls /metrics up to 10 s until a line matches
  for _ in $(seq 100); do
    metrics > "$work/parsed.txt" 2> "$work/parse.err" && grep -qE "$1" "$work/parsed.txt" && return 0
    sleep 0.1
  done
  return 1
}

# journalctl -f: the journal arrives over time on a pipe, launch by launch.
fifo=$work/journal.fifo; mkfifo "$fifo"
"$kvaudit" watch - --expect-from "$work/check.json" --listen 127.0.0.1:0 --interval 0.1 \
  < "$fifo" 2> "$work/watch.err" &
watcher=$!
exec 3> "$fifo"
for _ in $(seq 50); do
  port=$(sed -n 's|.*metrics on http://127.0.0.1:\([0-9]*\)/metrics|\1|p' "$work/watch.err")
  [[ -n $port ]] && break; sleep 0.1
done
[[ -n $port ]] && pass || fail "no metrics address on stderr: $(cat "$work/watch.err")"
sed -n 1,106p "$journal" >&3
wait_for '^kvaudit_launch_ready\{launch="2"\} 1' && pass || fail "launch 2 never ready"
grep -q '^kvaudit_kv_cache_info{.*launch="2".*resolved="bf16"' "$work/parsed.txt" && pass ||
  fail "launch 2 not bf16: $(cat "$work/parsed.txt")"
grep -q '^kvaudit_expectation_failures{launch="2"} 0' "$work/parsed.txt" && pass ||
  fail "the fixed launch fails its expectations"
sed -n '107,$p' "$journal" >&3
wait_for '^kvaudit_expectation_failures\{launch="3"\} [1-9]' && pass ||
  fail "launch 3 (FP8 again) did not fail: $(cat "$work/parsed.txt")"
grep -q '^kvaudit_kv_cache_info{.*launch="3".*resolved="fp8_e4m3"' "$work/parsed.txt" && pass ||
  fail "launch 3 not fp8_e4m3"
grep -q '^kvaudit_expectation_failed{actual="fp8_e4m3",expected="bf16",key="kv_cache_dtype",launch="3"} 1' \
  "$work/parsed.txt" && pass || fail "no failed expectation sample for the dtype"
grep -q '^kvaudit_watch_launches_total{} 3' "$work/parsed.txt" && pass || fail "launches_total"
grep -q 'launch 3 (line 111): sglang, KV cache fp8_e4m3 (requested auto).*EXPECTATION FAILED: kv_cache_dtype=bf16 (shows fp8_e4m3)' \
  "$work/watch.err" && pass || fail "no line for people on stderr: $(cat "$work/watch.err")"
exec 3>&-  # journalctl ends: so does the watch
wait "$watcher"; status=$?; watcher=""
[[ $status -eq 0 ]] && pass || fail "watch exit $status after its input ended"

# --once: a gate for scripts and cron.
"$kvaudit" watch "$journal" --once --expect kv_cache_dtype=bf16 --quiet > "$work/once.txt"
[[ $? -eq 1 ]] && pass || fail "--once on the reverted journal: expected exit 1"
"$kvaudit" watch tests/fixtures/logs/journal_qwen35_fp8_then_bf16.log --once \
  --expect-from "$work/check.json" --quiet > "$work/once.txt"
[[ $? -eq 0 ]] && pass || fail "--once on the fixed journal: expected exit 0"
grep -q '^kvaudit_kv_cache_info{.*launch="2".*resolved="bf16"' "$work/once.txt" && pass ||
  fail "--once prints the metrics"

# The example alerting rules name only metrics watch serves (each expr's kvaudit_* names
# against the families of the run above), and the example unit runs a watch of stdin.
/usr/bin/python3 - examples/prometheus/kvaudit-alerts.yml "$work/once.txt" <<'PY' && pass ||
import re, sys, yaml
rules = [r for g in yaml.safe_load(open(sys.argv[1]))["groups"] for r in g["rules"]]
served = set(re.findall(r"^# TYPE (\S+)", open(sys.argv[2]).read(), re.M))
served |= {"kvaudit_kv_scale_fallback", "kvaudit_kv_capacity_tokens"}  # only when known
assert len(rules) >= 5, rules
for rule in rules:
    names = set(re.findall(r"kvaudit_[a-z_]+", rule["expr"]))
    assert names and names <= served, (rule["alert"], names - served)
PY
  fail "alert rules name metrics watch does not serve"
grep -q 'kvaudit watch - --expect-from' examples/systemd/kvaudit-watch.service && pass ||
  fail "the example unit does not run a watch of its journal"

# A log file, rotated while followed (logrotate's rename, then a new file).
log=$work/sglang.log
sed -n 1,59p "$journal" > "$log"
"$kvaudit" watch "$log" --expect kv_cache_dtype=bf16 --listen 127.0.0.1:0 --interval 0.1 \
  --quiet 2> "$work/file.err" &
watcher=$!
port=""
for _ in $(seq 50); do
  port=$(sed -n 's|.*metrics on http://127.0.0.1:\([0-9]*\)/metrics|\1|p' "$work/file.err")
  [[ -n $port ]] && break; sleep 0.1
done
wait_for '^kvaudit_expectation_failures\{launch="1"\} 1' && pass || fail "file: launch 1"
mv "$log" "$log.1"
sed -n '60,$p' "$journal" > "$log"
wait_for '^kvaudit_watch_rotations_total\{\} 1' && pass || fail "file: rotation not seen"
wait_for '^kvaudit_expectation_failures\{launch="3"\} 1' && pass || fail "file: launch 3 after rotation"
kill -TERM "$watcher"; wait "$watcher"; status=$?; watcher=""
[[ $status -eq 0 ]] && pass || fail "SIGTERM: exit $status"

# Bad input: one line naming it, exit 2.
bad() {  # DESCRIPTION ARGS...
  local what=$1; shift
  "$kvaudit" watch "$@" > "$work/bad.out" 2> "$work/bad.err"; local s=$?
  [[ $s -eq 2 && $(wc -l < "$work/bad.err") -eq 1 ]] && pass ||
    fail "$what: exit $s, stderr: $(cat "$work/bad.err")"
}
bad "folder" tests/fixtures/logs --once
bad "missing file" "$work/none.log" --once
printf 'x\0y\n' > "$work/binary.log"
bad "binary" "$work/binary.log" --once
bad "bad URL" "http://[::1" --once
bad "bad --listen" "$journal" --listen nowhere
bad "bad --expect" "$journal" --once --expect colour=blue
bad "--once over empty input" - --once --expect kv_cache_dtype=bf16 < /dev/null
printf 'GET /health 200\n' > "$work/no-launch.log"
bad "--once over a log with no launch" "$work/no-launch.log" --once
echo '{"command": "logs"}' > "$work/not-check.json"
bad "not check's JSON" "$journal" --once --expect-from "$work/not-check.json"
# 192.0.2.1 (TEST-NET-1) is no address of this machine.
"$kvaudit" watch "$journal" --listen 192.0.2.1:9477 --for 1 > /dev/null 2> "$work/bad.err"; s=$?
[[ $s -eq 2 ]] && grep -q '192.0.2.1:9477' "$work/bad.err" && pass || fail "foreign address: exit $s"

finish watch_cli
