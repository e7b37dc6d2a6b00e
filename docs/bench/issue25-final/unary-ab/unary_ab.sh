#!/bin/bash
# non-streaming added p50: before issue 25 (5579c71), the first session's end (beb7fb1), today's main; 3 rounds interleaved
# wt-before: a worktree at 5579c71; wt-base: a worktree at beb7fb1 (PYTHONPATH picks the tree).
out=/work/main/docs/bench/issue25-final/unary-ab; mkdir -p $out
for i in 1 2 3; do
  for side in before first-session final; do
    case $side in before) export PYTHONPATH=/work/wt-before;; first-session) export PYTHONPATH=/work/wt-base;; final) unset PYTHONPATH;; esac
    cd /tmp && /work/main/.venv/bin/nnrp-gateway bench run --scenario unary > $out/$side-$i.txt 2>&1
  done
done
echo done > /work/scratch/unary.DONE
