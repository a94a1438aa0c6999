#!/usr/bin/env bash
# kvaudit probe end to end against `kvaudit serve` on the fixture model (127.0.0.1 only):
# detection and findings in JSON, smoke with a results file and its resume, and every bad
# input or dead server as one line on stderr, exit 2, no partial HTML.
source "$(dirname "$0")/lib.bash" "$@"
server_pid=""
at_exit '[[ -n $server_pid ]] && kill "$server_pid"; wait'
model=$root/tests/fixtures/model/qwen3-pystd

# Bad input and unreachable servers: exit 2, one line, no HTML file.
closed_port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for args in "ftp://127.0.0.1:1" "http://127.0.0.1:99999" "http://127.0.0.1:$closed_port --retries 1 --backoff 0.05" \
    "http://127.0.0.1:1 --recall --recall-ctx abc" "http://127.0.0.1:1 --timeout 0"; do
  err=$("$kvaudit" probe $args --html "$work/bad.html" 2>&1 >/dev/null); status=$?
  [[ $status -eq 2 ]] && pass || fail "'$args' exit $status, expected 2"
  [[ $(wc -l <<< "$err") -eq 1 && $err == kvaudit:* ]] && pass || fail "'$args' stderr: $err"
  [[ ! -e $work/bad.html ]] && pass || fail "'$args' left an HTML file"
done
err=$("$kvaudit" probe "http://127.0.0.1:$closed_port" --retries 0 2>&1 >/dev/null)
[[ $err == *"connection refused"* ]] && pass || fail "refused message: $err"

# A live server: kvaudit serve on the fixture model at a free port.
"$kvaudit" serve --model "$model" --kv-cache-dtype fp8_e4m3 --port 0 > "$work/serve.log" 2>&1 &
server_pid=$!
url=""
for _ in $(seq 1 100); do
  url=$(grep -so 'http://127.0.0.1:[0-9]*' "$work/serve.log" | tail -n 1)
  [[ -n $url ]] && break
  sleep 0.1
done
[[ -n $url ]] && pass || { fail "serve did not start: $(tail -n 5 "$work/serve.log")"; echo "probe_cli: $passed passed, $failures failed"; exit 1; }

json=$("$kvaudit" probe "$url" --kv-policy lossless --json); status=$?
# The served checkpoint is found at its model_path: the full check runs (fp8 at scale 1.0),
# critical under the lossless policy (under the default one its key norms bound the keys).
[[ $status -eq 1 ]] && pass || fail "detection exit $status, expected 1 (critical finding)"
/usr/bin/python3 - "$json" <<'PY' && pass || fail "detection JSON"
import json, sys
doc = json.loads(sys.argv[1])
server = doc["servers"][0]
assert server["engine"] == "sglang", server
assert server["kv_cache_dtype"] == "fp8_e4m3", server
assert server["capacity_tokens"] > 0 and server["context_length"] == 4096, server
assert server["has_tokenize"] is True
assert any(f["id"] == "fp8-unit-scale" for f in doc["findings"]), doc["findings"]
PY

results=$work/results.jsonl
"$kvaudit" probe "$url" --smoke --results "$results" --json --fail-on never > "$work/first.json"
lines=$(wc -l < "$results")
[[ $lines -eq 3 ]] && pass || fail "results file has $lines lines, expected 3"
"$kvaudit" probe "$url" --smoke --results "$results" --json --fail-on never --html "$work/probe.html" > "$work/second.json"
/usr/bin/python3 - "$work/first.json" "$work/second.json" <<'PY' && pass || fail "resume"
import json, sys
first, second = (json.load(open(p)) for p in sys.argv[1:3])
assert first["servers"][0]["resumed"] == 0
assert second["servers"][0]["resumed"] == 3, second["servers"][0]["resumed"]
assert second["servers"][0]["requests"] < first["servers"][0]["requests"]
assert [r["output"] for r in first["servers"][0]["records"]] == \
       [r["output"] for r in second["servers"][0]["records"]]
PY
[[ $(wc -l < "$results") -eq 3 ]] && pass || fail "a resumed run appended lines"
[[ -s $work/probe.html ]] && pass || fail "no HTML report"

# The server dies: one clear line, exit 2.
kill "$server_pid"; wait "$server_pid" 2>/dev/null; server_pid=""
err=$("$kvaudit" probe "$url" --smoke --retries 1 --backoff 0.05 2>&1 >/dev/null); status=$?
[[ $status -eq 2 && $err == *"connection refused"* && $(wc -l <<< "$err") -eq 1 ]] && pass \
  || fail "dead server: exit $status, $err"

finish probe_cli
