#!/usr/bin/env bash
# GPU smoke: the compose stack with a given vLLM image, readiness, the conformance suite and
# a live benchmark against it, then teardown. Needs Docker, the NVIDIA runtime and a GPU.
#
#   deploy/smoke.sh v0.26.0 Qwen/Qwen2.5-0.5B-Instruct      # anchors: v0.18.1 v0.22.1 v0.26.0
set -euo pipefail
TAG=${1:?vLLM image tag, e.g. v0.26.0}
MODEL=${2:?model, e.g. Qwen/Qwen2.5-0.5B-Instruct}
here=$(cd "$(dirname "$0")" && pwd)
compose=(docker compose -f "$here/docker-compose.yml")
export VLLM_IMAGE_TAG=$TAG MODEL=$MODEL SERVED_MODEL_NAME=example-model
out=${OUT:-$here/../out/smoke-$TAG}
mkdir -p "$out"
trap '"${compose[@]}" logs --no-color > "$out/compose.log" 2>&1 || true; "${compose[@]}" down -v' EXIT
"${compose[@]}" up -d --build
echo "waiting for the gateway's /readyz (vLLM model load included)..."
for _ in $(seq 180); do
  curl -sf http://127.0.0.1:9090/readyz >/dev/null && break
  sleep 5
done
curl -sf http://127.0.0.1:9090/readyz
gw() { "${compose[@]}" exec -T gateway nnrp-gateway "$@"; }
gw check --vllm-url http://127.0.0.1:8000 --json | tee "$out/check.json"
# The suite against the real vLLM; the two recipes a real vLLM cannot answer as written run
# against a replay vLLM started beside it (deploy/conformance-smoke.sh says which ran where).
"${compose[@]}" cp "$here/conformance-smoke.sh" gateway:/tmp/conformance-smoke.sh
"${compose[@]}" exec -T gateway bash /tmp/conformance-smoke.sh tcp://127.0.0.1:7700 \
  /tmp/smoke | tee "$out/conformance.txt"
gw bench live --vllm-url http://127.0.0.1:8000 --endpoint tcp://127.0.0.1:7700 \
  --model example-model --json | tee "$out/bench-live.json"
echo "smoke passed for vLLM $TAG"
