#!/usr/bin/env bash
# Load test for kvaudit serve: wrk (Debian's) holds CONNECTIONS keep-alive clients against
# /v1/completions (greedy, a short code prompt) for DURATION seconds on loopback, then
# reports requests/s, latency percentiles, failed requests and the server's peak RSS
# (VmHWM). Exits non-zero if any request failed or the server did not exit cleanly.
# usage: tools/bench-serve.sh [KVAUDIT_BINARY] [MODEL_DIR]
#   env: DURATION (60), CONNECTIONS (32), MAX_TOKENS (8), KV (bf16), WRK_THREADS (2)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$root/build/kvaudit}
model=${2:-$root/tests/fixtures/model/qwen3-pystd}
duration=${DURATION:-60}
connections=${CONNECTIONS:-32}
max_tokens=${MAX_TOKENS:-8}
kv=${KV:-bf16}
command -v wrk > /dev/null || {
  echo "bench-serve: wrk is not installed (tools/install-deps.sh --dev)" >&2
  exit 2
}
work=$(mktemp -d)
server_pid=""
cleanup() {
  [[ -n $server_pid ]] && kill "$server_pid" 2> /dev/null
  rm -rf "$work"
}
trap cleanup EXIT

"$bin" serve --model "$model" --kv-cache-dtype "$kv" --port 0 --http-threads $((connections + 8)) \
  --max-queued-requests $((connections * 4)) 2> "$work/server.log" &
server_pid=$!
for _ in $(seq 1 300); do
  grep -q "ready to roll" "$work/server.log" && break
  sleep 0.1
done
port=$(grep "ready to roll" "$work/server.log" | grep -o '127\.0\.0\.1:[0-9]*' | cut -d: -f2)
[[ -n $port ]] || {
  echo "bench-serve: server did not start" >&2
  cat "$work/server.log" >&2
  exit 1
}
rss_start_kib=$(awk '/^VmRSS/ {print $2}' "/proc/$server_pid/status")

cat > "$work/post.lua" << EOF
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"prompt": "def fibonacci(n):\\\\n    if n < 2:\\\\n        return n\\\\n", "max_tokens": $max_tokens, "temperature": 0}'
EOF
echo "bench-serve: $connections connections, ${duration}s, max_tokens $max_tokens, KV $kv, port $port"
wrk -t"${WRK_THREADS:-2}" -c"$connections" -d"${duration}s" --timeout 30s --latency \
  -s "$work/post.lua" "http://127.0.0.1:$port/v1/completions" | tee "$work/wrk.txt"

rss_peak_kib=$(awk '/^VmHWM/ {print $2}' "/proc/$server_pid/status")
rss_end_kib=$(awk '/^VmRSS/ {print $2}' "/proc/$server_pid/status")
completed=$(curl -s "http://127.0.0.1:$port/metrics" |
  awk '/^vllm:e2e_request_latency_seconds_count/ {print $2}')
kill -TERM "$server_pid"
wait "$server_pid"
server_status=$?
server_pid=""

non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $NF}' "$work/wrk.txt")
socket_errors=$(grep -c "Socket errors" "$work/wrk.txt" || true)
echo "bench-serve: server RSS at start ${rss_start_kib} KiB, at end ${rss_end_kib} KiB, peak ${rss_peak_kib} KiB"
echo "bench-serve: completions answered (server count): ${completed}"
echo "bench-serve: non-2xx responses: ${non2xx:-0}, socket error lines: ${socket_errors}, server exit ${server_status}"
[[ -z $non2xx && $socket_errors -eq 0 && $server_status -eq 0 ]]
