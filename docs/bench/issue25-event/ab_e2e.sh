#!/bin/bash
# Run in this order: before-1 (main's tree, 1754315, extracted to /tmp/ab-before with
# git archive), then this script: rounds 2-4 alternating, then after-1.
# Alternating full `bench run --scenario cost --scenario throughput`: main's tree, this branch's.
for round in 2 3 4; do
  for tree in before after; do
    if [ $tree = before ]; then src=/tmp/ab-before; else src=/work/wt-perf-event; fi
    cd $src && PYTHONPATH=$src /work/wt-perf-event/.venv/bin/python -c 'import sys; sys.argv=["nnrp-gateway","bench","run","--scenario","cost","--scenario","throughput","--out","/tmp/ab-e2e/'$tree-$round'"]; import cli.main as m, gateway; print(gateway.__file__, file=sys.stderr); m.main()' > /tmp/ab-e2e/$tree-$round.txt 2>&1
    echo "$tree-$round $(uptime)" >> /tmp/ab-e2e/load.txt
  done
done
cd /tmp && PYTHONPATH=/work/wt-perf-event /work/wt-perf-event/.venv/bin/python -c 'import sys; sys.argv=["nnrp-gateway","bench","run","--scenario","cost","--scenario","throughput","--out","/tmp/ab-e2e/after-1"]; import cli.main as m; m.main()' > /tmp/ab-e2e/after-1.txt 2>&1
echo done >> /tmp/ab-e2e/load.txt
