#!/bin/bash
# main (auto, float32) vs cpu2 (auto) interleaved, 1 thread, the 512-token prefill (prefill_ab.py)
S=/work/wt-cpu2/benchmarks/results/2026-12-02-h200-s22/cpu2/prefill_ab.py
for i in 1 2 3; do
  for run in "/work/main auto" "/work/wt-cpu2 auto" "/work/main float32"; do
    set -- $run
    echo -n "$1: "
    (cd $1 && OMP_NUM_THREADS=1 PYTHONPATH=$1 /work/main/.venv/bin/python $S $2 2>&1 | grep prefill)
  done
done
