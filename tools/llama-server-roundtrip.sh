#!/usr/bin/env bash
# probe --roundtrip against a real llama.cpp llama-server (not part of `make test`): one slot
# (the "device" cache) and its host-RAM prompt cache (--cache-ram) as the tier behind it,
# then the same with the host cache off (a server whose evicted prompts are computed again).
# llama.cpp is built beside the project, never in it; the model is the fixture converted by
# tools/make_gguf_fixture.py.
#
# Usage: LLAMA_SERVER=/path/to/llama-server MODEL=/path/to/model.gguf \
#          tools/llama-server-roundtrip.sh [KVAUDIT=build/kvaudit] [PORT=18090] [OUT=dir]
# Prints each run's verdict, what served each pass and each check; the JSON reports stay in
# OUT (default /tmp/kvaudit-llama-roundtrip). Exit 1 when a run's verdict is not the
# expected one ("tiers agree" for both: the RAM tier agrees; without it nothing but the slot).
set -uo pipefail
kvaudit=${KVAUDIT:-build/kvaudit}
port=${PORT:-18090}
out=${OUT:-/tmp/kvaudit-llama-roundtrip}
die() { echo "llama-server-roundtrip: $*" >&2; exit 2; }
[[ -n ${LLAMA_SERVER:-} && -x $LLAMA_SERVER ]] || die "set LLAMA_SERVER to a llama-server binary"
[[ -n ${MODEL:-} && -f $MODEL ]] || die "set MODEL to a GGUF file"
[[ -x $kvaudit ]] || die "no kvaudit binary at $kvaudit (make build)"
mkdir -p "$out"
pid=
trap '[[ -n $pid ]] && kill "$pid" 2>/dev/null' EXIT
failed=0

run() {
  local name=$1 expected=$2; shift 2
  "$LLAMA_SERVER" -m "$MODEL" --host 127.0.0.1 --port "$port" -c 4096 --metrics --slots -t 1 \
    "$@" > "$out/$name.server.log" 2>&1 &
  pid=$!
  local up=0
  for _ in $(seq 1 120); do
    curl -s --max-time 2 "http://127.0.0.1:$port/health" | grep -q ok && { up=1; break; }
    sleep 0.5
  done
  [[ $up == 1 ]] || die "llama-server did not come up (see $out/$name.server.log)"
  "$kvaudit" probe "http://127.0.0.1:$port" --roundtrip --roundtrip-time-limit 300 --json \
    > "$out/$name.json"
  echo "== $name ($*): exit $?"
  python3 - "$out/$name.json" "$expected" <<'PY' || failed=1
import json, sys
d = json.load(open(sys.argv[1]))["roundtrip"]
print(" ", d["verdict"], "|", d["reason"])
print("  eviction:", d["eviction"]["note"])
for p in d["passes"]:
    print("  ", p["name"], "|", p["served_by"], "|", p["served_by_evidence"])
for c in d["checks"]:
    print("  ", c["sentence"])
sys.exit(0 if d["verdict"] == sys.argv[2] else 1)
PY
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=
}

run ram-cache "tiers agree" -np 1 --cache-ram 64
run no-ram-cache "tiers agree" -np 1 --cache-ram 0
run two-slots "tiers agree" -np 2 --cache-ram 64
exit $failed
