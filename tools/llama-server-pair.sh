#!/usr/bin/env bash
# Two real llama.cpp servers on 127.0.0.1 serving the same GGUF, for `kvaudit probe` against an
# engine nobody on this team wrote (not part of `make test`):
#   A  http://127.0.0.1:18081  F16 KV cache     (-ctk f16 -ctv f16)
#   B  http://127.0.0.1:18082  Q4_0 KV cache    (-fa on -ctk q4_0 -ctv q4_0)
# both with -c 4096 --metrics --slots -t 1. llama.cpp is built beside the project, never in it;
# the model is the fixture converted by tools/make_gguf_fixture.py.
#
# Usage: LLAMA_SERVER=/path/to/llama-server MODEL=/path/to/model.gguf \
#          tools/llama-server-pair.sh [run|start|stop]
#   run    (default) start both, wait for /health, print the URLs, keep them up until this
#          script is interrupted (Ctrl-C / TERM) and stop them on exit
#   start  the same, but leave them running in the background and return
#   stop   stop the pair left by `start`
# Environment: LLAMA_SERVER, MODEL (needed for run/start), PAIR_DIR (pid files and logs;
# default /tmp/kvaudit-llama-pair), PORT_A/PORT_B (18081/18082), WAIT_S (60),
# LLAMA_EXTRA_ARGS (appended to both command lines).
set -uo pipefail
mode=${1:-run}
dir=${PAIR_DIR:-/tmp/kvaudit-llama-pair}
port_a=${PORT_A:-18081}
port_b=${PORT_B:-18082}
wait_s=${WAIT_S:-60}
die() { echo "llama-server-pair: $*" >&2; exit 1; }

# Stops the server whose pid is in $1, only if that pid is still a llama-server.
stop_one() {
  local file=$1 pid
  [[ -f $file ]] || return 0
  pid=$(cat "$file")
  if [[ -n $pid ]] && { tr '\0' ' ' < "/proc/$pid/cmdline"; } 2>/dev/null | grep -q llama-server; then
    kill "$pid" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null
  fi
  rm -f "$file"
}
stop_pair() { stop_one "$dir/a.pid"; stop_one "$dir/b.pid"; }

case $mode in
  stop) stop_pair; echo "llama-server-pair: stopped"; exit 0 ;;
  run|start) ;;
  *) die "unknown argument '$mode' (run, start or stop)" ;;
esac

[[ -n ${LLAMA_SERVER:-} && -x $LLAMA_SERVER ]] || die "set LLAMA_SERVER to a llama-server binary"
[[ -n ${MODEL:-} && -f $MODEL ]] || die "set MODEL to a GGUF file"
mkdir -p "$dir"
for f in "$dir/a.pid" "$dir/b.pid"; do
  [[ -f $f ]] && kill -0 "$(cat "$f")" 2>/dev/null && die "a pair is already running ($dir); run: $0 stop"
done
if [[ $mode == run ]]; then trap 'stop_pair' EXIT; trap 'exit 130' INT TERM; fi

common=(-m "$MODEL" --host 127.0.0.1 -c 4096 --metrics --slots -t 1)
# shellcheck disable=SC2206
extra=(${LLAMA_EXTRA_ARGS:-})
"$LLAMA_SERVER" "${common[@]}" --port "$port_a" -ctk f16 -ctv f16 "${extra[@]}" \
  > "$dir/a.log" 2>&1 &
echo $! > "$dir/a.pid"
"$LLAMA_SERVER" "${common[@]}" --port "$port_b" -fa on -ctk q4_0 -ctv q4_0 "${extra[@]}" \
  > "$dir/b.log" 2>&1 &
echo $! > "$dir/b.pid"

healthy() { curl -sf --max-time 2 "http://127.0.0.1:$1/health" > /dev/null; }
deadline=$((SECONDS + wait_s))
for side in a:$port_a b:$port_b; do
  name=${side%%:*} port=${side#*:}
  until healthy "$port"; do
    kill -0 "$(cat "$dir/$name.pid")" 2>/dev/null || { stop_pair; die "server $name exited: $(tail -n 5 "$dir/$name.log")"; }
    (( SECONDS < deadline )) || { stop_pair; die "server $name not healthy after ${wait_s}s: $(tail -n 5 "$dir/$name.log")"; }
    sleep 0.5
  done
done
echo "A (f16 KV)  http://127.0.0.1:$port_a   log $dir/a.log"
echo "B (q4_0 KV) http://127.0.0.1:$port_b   log $dir/b.log"
if [[ $mode == start ]]; then
  echo "llama-server-pair: running in the background; stop with: $0 stop"
  exit 0
fi
echo "llama-server-pair: Ctrl-C to stop"
while kill -0 "$(cat "$dir/a.pid" 2>/dev/null)" 2>/dev/null && kill -0 "$(cat "$dir/b.pid" 2>/dev/null)" 2>/dev/null; do
  sleep 1
done
die "a server exited; see $dir/a.log and $dir/b.log"
