#!/usr/bin/env bash
# The release smoke's conformance step, against a gateway in front of a REAL vLLM:
#
#   deploy/conformance-smoke.sh tcp://127.0.0.1:7700 OUT_DIR
#
# A real vLLM cannot answer two suite recipes as written (a backend that fails on demand;
# a model that follows automatic tool choice). So this starts a second gateway in front of
# the replay vLLM on free loopback ports and runs those recipes there ("scripted backend"
# in the report); every other recipe runs against the real one. Then the strict validation
# and the wire scenarios against the real one. deploy/smoke.sh runs it inside the gateway
# container; here it runs as is (BIN: where nnrp-gateway lives).
set -euo pipefail
LIVE=${1:?the gateway in front of the real vLLM, e.g. tcp://127.0.0.1:7700}
OUT=${2:?output directory}
BIN=${BIN:-$(dirname "$(command -v nnrp-gateway)")}
gw="$BIN/nnrp-gateway"
mkdir -p "$OUT"
pick_port() { "$BIN/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
REPLAY_PORT=$(pick_port); SCRIPTED_PORT=$(pick_port); ADMIN_PORT=$(pick_port)
"$gw" replay-server --listen "127.0.0.1:$REPLAY_PORT" --speed 4 > "$OUT/replay.log" 2>&1 &
replay=$!
"$gw" serve --listen "tcp://127.0.0.1:$SCRIPTED_PORT" --vllm-url "http://127.0.0.1:$REPLAY_PORT" \
  --tool-calls --admin-listen "127.0.0.1:$ADMIN_PORT" > "$OUT/scripted-gateway.log" 2>&1 &
scripted=$!
trap 'kill $scripted $replay 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  "$gw" health --ready --quiet --admin-url "http://127.0.0.1:$ADMIN_PORT" && break
  sleep 0.2
done
"$gw" health --ready --admin-url "http://127.0.0.1:$ADMIN_PORT"
"$gw" conformance run --endpoint "$LIVE" --client builtin --suite-only \
  --scripted-endpoint "tcp://127.0.0.1:$SCRIPTED_PORT" --out "$OUT/conformance" \
  | tee "$OUT/conformance.txt"
"$gw" conformance validate --results "$OUT/conformance/results.json"
"$gw" conformance wire-probe --endpoint "$LIVE" --out "$OUT/wire.json"
echo "conformance smoke passed against $LIVE"
