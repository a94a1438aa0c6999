#!/usr/bin/env bash
# kvaudit serve end to end on loopback: start it on a free port, talk to it with curl, read
# its start-up log with `kvaudit logs` and `plan --from-log` (they must agree with what it
# printed and with `check`), SIGTERM during a request (the request completes, exit 0), the
# motivating FP8-without-scales launch, and bad flags (one line on stderr, exit 2).
# usage: serve_cli.sh KVAUDIT_BINARY SOURCE_DIR BUILD_DIR
source "$(dirname "$0")/lib.bash" "$@"
BIN=$kvaudit
SRC=$root
pids=()
at_exit 'for pid in "${pids[@]}"; do kill "$pid"; done'
MODEL=$SRC/tests/fixtures/model/qwen3-pystd
json() { # json 'JSON TEXT' PYTHON_EXPR -> prints the value (d is the document)
  /usr/bin/python3 -c "import json,sys; d=json.loads(sys.argv[1]); print($2)" "$1"
}
if ! command -v curl > /dev/null; then
  echo "serve_cli: curl is not installed (tools/install-deps.sh --full)"
  exit 1
fi

# start NAME ARGS...: runs serve in the background, waits for the ready line, sets PORT.
start() {
  local name=$1
  shift
  "$BIN" serve --port 0 "$@" 2> "$work/$name.log" &
  local pid=$!
  pids+=("$pid")
  eval "${name}_pid=$pid"
  for _ in $(seq 1 300); do
    if grep -q "ready to roll" "$work/$name.log"; then
      PORT=$(grep "ready to roll" "$work/$name.log" | grep -o '127\.0\.0\.1:[0-9]*' | cut -d: -f2)
      return 0
    fi
    kill -0 "$pid" 2> /dev/null || break
    sleep 0.1
  done
  fail "$name did not become ready: $(tail -3 "$work/$name.log")"
  return 1
}

# --- BF16 launch: endpoints over curl.
start bf16 --model "$MODEL" --kv-cache-dtype bf16 --served-model-name fixture || exit 1
url=http://127.0.0.1:$PORT
[[ $(curl -s -o /dev/null -w '%{http_code}' "$url/health") == 200 ]] && pass || fail "health"
models=$(curl -s "$url/v1/models")
[[ $(json "$models" "d['data'][0]['id'], d['data'][0]['max_model_len']") == "fixture 4096" ]] &&
  pass || fail "models: $models"
body='{"model": "fixture", "prompt": "def add(a, b):", "max_tokens": 12, "temperature": 0, "logprobs": 2}'
first=$(curl -s "$url/v1/completions" -H 'Content-Type: application/json' -d "$body")
second=$(curl -s "$url/v1/completions" -H 'Content-Type: application/json' -d "$body")
[[ $(json "$first" "d['choices'][0]['text']") == $(json "$second" "d['choices'][0]['text']") ]] &&
  pass || fail "greedy not repeatable"
[[ $(json "$first" "d['usage']['completion_tokens'], len(d['choices'][0]['logprobs']['tokens'])") == "12 12" ]] &&
  pass || fail "completion: $first"
chat=$(curl -s "$url/v1/chat/completions" -d '{"messages": [{"role": "user", "content": "x = 1"}], "max_tokens": 4, "temperature": 0, "logprobs": true, "top_logprobs": 1}')
[[ $(json "$chat" "d['choices'][0]['message']['role'], len(d['choices'][0]['logprobs']['content'][0]['top_logprobs'])") == "assistant 1" ]] &&
  pass || fail "chat: $chat"
tok=$(curl -s "$url/tokenize" -d '{"text": "import os"}')
[[ $(json "$tok" "d['count'] == len(d['tokens']) > 0") == True ]] && pass || fail "tokenize: $tok"
info=$(curl -s "$url/get_server_info")
[[ $(json "$info" "d['kv_cache_dtype'], d['max_total_num_tokens'], d['tp_size']") == "bf16 65536 1" ]] &&
  pass || fail "server info: $info"
# Read whole first: under pipefail, grep -q leaving early fails curl's write (exit 23).
metrics=$(curl -s "$url/metrics")
grep -q '^vllm:cache_config_info{block_size="1",cache_dtype="bf16",.*num_gpu_blocks="65536"' <<< "$metrics" &&
  pass || fail "metrics gauge"
code=$(curl -s -o "$work/err.json" -w '%{http_code}' "$url/v1/completions" -d '{"prompt": 5}')
[[ $code == 400 && $(json "$(cat "$work/err.json")" "d['error']['code']") == 400 ]] && pass || fail "400 body"

# SIGTERM while a request runs: it completes, the server exits 0.
curl -s "$url/v1/completions" -d '{"prompt": "class A:", "max_tokens": 300, "temperature": 0, "ignore_eos": true}' \
  > "$work/inflight.json" &
curl_pid=$!
for _ in $(seq 1 200); do
  grep -q 'vllm:num_requests_running{model_name="fixture"} 1' <<< "$(curl -s "$url/metrics")" && break
  sleep 0.01
done
kill -TERM "$bf16_pid"
wait "$bf16_pid"
status=$?
wait "$curl_pid"
[[ $status -eq 0 ]] && pass || fail "exit status after SIGTERM: $status"
[[ $(json "$(cat "$work/inflight.json")" "d['usage']['completion_tokens']") == 300 ]] && pass ||
  fail "in-flight request was not finished: $(head -c 200 "$work/inflight.json")"
curl -s -o /dev/null "$url/health" && fail "still accepting after SIGTERM" || pass

# The log reads like a real SGLang launch.
"$BIN" logs "$work/bf16.log" --checkpoint "$MODEL" --expect kv_cache_dtype=bf16 --expect ready=true \
  --expect engine=sglang --expect max_total_tokens=65536 --json > "$work/logs.json"
[[ $? -eq 0 ]] && pass || fail "logs --expect on the bf16 launch"
[[ $(json "$(cat "$work/logs.json")" "sorted({f['id'] for f in d['findings']} & {'capacity-as-planned', 'capacity-mismatch', 'check-agrees'})") == "['capacity-as-planned', 'check-agrees']" ]] &&
  pass || fail "logs findings: $(head -c 600 "$work/logs.json")"
"$BIN" plan "$MODEL" --from-log "$work/bf16.log" --json > "$work/plan.json"
[[ $? -eq 0 && $(json "$(cat "$work/plan.json")" "[c['inside'] for c in d['from_log']['checks']]") == "[True, True]" ]] &&
  pass || fail "plan --from-log: $(head -c 400 "$work/plan.json")"

# --- The motivating launch: FP8 KV declared, no scales, --kv-cache-dtype auto.
mkdir -p "$work/fp8"
for f in "$MODEL"/*; do ln -s "$f" "$work/fp8/"; done
cat > "$work/fp8/hf_quant_config.json" << 'EOF'
{"producer": {"name": "modelopt", "version": "0.29.0"},
 "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}
EOF
start fp8 --model "$work/fp8" --kv-cache-dtype auto || exit 1
grep -q "Using FP8 KV cache but no scaling factors provided. Defaulting to scaling factors of 1.0." "$work/fp8.log" &&
  pass || fail "no SGLang scale warning"
info=$(curl -s "http://127.0.0.1:$PORT/get_server_info")
[[ $(json "$info" "d['kv_cache_dtype'], d['kvaudit']['scale_source'], d['max_total_num_tokens']") == "fp8_e4m3 unit_default 131072" ]] &&
  pass || fail "fp8 server info: $info"
kill -INT "$fp8_pid"
wait "$fp8_pid" && pass || fail "SIGINT exit status"
"$BIN" logs "$work/fp8.log" --checkpoint "$work/fp8" --expect kv_cache_dtype=fp8_e4m3 \
  --expect scale_fallback=true -q > /dev/null
[[ $? -eq 0 ]] && pass || fail "logs does not confirm the FP8 scale-1.0 fallback"
"$BIN" logs "$work/fp8.log" --expect kv_cache_dtype=bf16 -q > /dev/null
[[ $? -eq 1 ]] && pass || fail "the FP8 launch passed a bf16 expectation"
"$BIN" plan "$work/fp8" --from-log "$work/fp8.log" --json > "$work/plan8.json"
[[ $(json "$(cat "$work/plan8.json")" "[c['inside'] for c in d['from_log']['checks']]") == "[True, True]" ]] &&
  pass || fail "plan --from-log fp8"

# --- --api-key from $KVAUDIT_API_KEY (out of the process list): 401 without it, the probe
# sends it from the same variable, and the key is in no log line or report.
key=k-$RANDOM-secret
KVAUDIT_API_KEY=$key start keyed --model "$MODEL" --kv-cache-dtype bf16 || exit 1
url=http://127.0.0.1:$PORT
[[ $(curl -s -o /dev/null -w '%{http_code}' "$url/v1/models") == 401 ]] && pass || fail "no key: not 401"
[[ $(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer ${key}x" "$url/v1/models") == 401 ]] &&
  pass || fail "a longer key was accepted"
[[ $(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $key" "$url/v1/models") == 200 ]] &&
  pass || fail "the key was refused"
[[ $(curl -s -o /dev/null -w '%{http_code}' "$url/health") == 200 ]] && pass || fail "health needs no key"
KVAUDIT_API_KEY=$key "$BIN" probe "$url" --json > "$work/keyed-probe.json" 2> "$work/keyed-probe.err"
probe_status=$?
((probe_status <= 1)) && pass || fail "probe with the key exited $probe_status: $(tail -2 "$work/keyed-probe.err")"
kill "$keyed_pid"; wait "$keyed_pid" 2> /dev/null
if grep -q -- "$key" "$work/keyed.log" "$work/keyed-probe.json" "$work/keyed-probe.err"; then
  fail "the key appears in a log or report: $(grep -l -- "$key" "$work"/keyed*)"
else
  pass
fi

# --- Bad input: one line on stderr, exit 2, nothing served.
check_bad() { # check_bad LABEL ARGS...
  local label=$1
  shift
  timeout 20 "$BIN" serve "$@" > "$work/out" 2> "$work/err"
  local status=$?
  [[ $status -eq 2 ]] && pass || fail "$label: exit $status, expected 2 ($(head -2 "$work/err"))"
  [[ $(grep -vc '^\[' "$work/err") -eq 1 && $(grep -v '^\[' "$work/err") == kvaudit:* ]] && pass ||
    fail "$label: stderr is not one error line: $(cat "$work/err")"
}
check_bad "missing model" --model "$work/nope" --port 0
check_bad "unknown dtype" --model "$MODEL" --kv-cache-dtype fp7 --port 0
check_bad "context too long" --model "$MODEL" --context-length 1m --port 0
check_bad "bad port" --model "$MODEL" --port 70000
timeout 20 "$BIN" serve --model "$MODEL" --no-such-flag > /dev/null 2>&1
[[ $? -eq 2 ]] && pass || fail "unknown flag: exit status"
start busy --model "$MODEL" || exit 1
check_bad "port in use" --model "$MODEL" --port "$PORT"
kill -TERM "$busy_pid"
wait "$busy_pid"

finish serve_cli
