#!/bin/bash
# What ran (paths as they were): base = main at beb7fb1 (PYTHONPATH to its worktree), new = main with the fast emit and the filtered log line; perreq.py measures the gateway CPU per short request.
# A/B: base (beb7fb1) vs main HEAD, alternating; cost + throughput + per-request.
out=/work/scratch/ab; mkdir -p $out
for i in 1 2 3; do
  for side in base new; do
    if [ $side = base ]; then export PYTHONPATH=/work/wt-base; else unset PYTHONPATH; fi
    cd /tmp
    /work/main/.venv/bin/nnrp-gateway bench run --scenario cost --scenario throughput --out $out/$side-$i > $out/$side-$i.txt 2>&1
    /work/main/.venv/bin/python /work/scratch/perreq.py "" s16 > $out/$side-$i-perreq.txt 2>&1
  done
done
echo done > $out/DONE
