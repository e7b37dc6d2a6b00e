#!/usr/bin/env bash
# usage: run.sh BUILD(venv dir) STREAMS TAG [perf|pyspy|none]
set -u
cd /work/main
VENV=$1; N=$2; TAG=$3; PROF=${4:-perf}
OUT=/tmp/liveprof/$TAG; mkdir -p $OUT
$VENV/bin/nnrp-gateway serve --listen tcp://127.0.0.1:7301 --vllm-url http://127.0.0.1:8057 \
  --admin-listen 127.0.0.1:7302 --log-level warning --allow-untested-vllm > $OUT/gw.log 2>&1 &
GW=$!
for i in $(seq 100); do curl -s -m1 http://127.0.0.1:7302/readyz >/dev/null && break; sleep 0.2; done
$VENV/bin/nnrp-gateway --version > $OUT/version.txt 2>&1
case $PROF in
  perf) perf record -e cpu-clock -F 999 --call-graph dwarf,16384 -p $GW -o $OUT/perf.data > $OUT/perf.log 2>&1 & PP=$! ;;
  pyspy) $VENV/bin/py-spy record -p $GW -r 500 --native -f raw -o $OUT/pyspy.collapsed > $OUT/pyspy.log 2>&1 & PP=$! ;;
  *) PP= ;;
esac
.venv/bin/nnrp-gateway bench live --vllm-url http://127.0.0.1:8057 --endpoint tcp://127.0.0.1:7301 --streams $N --out $OUT > $OUT/bench.txt 2>&1
[ -n "$PP" ] && kill -INT $PP && wait $PP
kill $GW; wait $GW 2>/dev/null
grep -E 'per event|per chunk|ratio|verdict' $OUT/bench.txt | head -20
