#!/bin/bash
# main vs cpu2 interleaved, 1 thread, the 512-token prefill (prefill_ab.py)
S=/work/wt-cpu2/benchmarks/results/2026-12-02-h200-s22/cpu2/prefill_ab.py
for i in 1 2 3 4; do
  for tree in /work/main /work/wt-cpu2; do
    echo -n "$tree: "
    (cd $tree && OMP_NUM_THREADS=1 PYTHONPATH=$tree /work/main/.venv/bin/python $S ${1:-auto} 2>&1 | grep prefill)
  done
done
