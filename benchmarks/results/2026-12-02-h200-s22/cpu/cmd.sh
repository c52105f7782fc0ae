# A/B, main (before) and the cpu branch (after) alternating, one thread each (loaded shared machine)
THREADS=1 benchmarks/results/2026-12-02-h200-s22/cpu/ab.sh 2 benchmarks/results/2026-12-02-h200-s22/cpu/decode_ab.py
THREADS=1 benchmarks/results/2026-12-02-h200-s22/cpu/ab.sh 2 benchmarks/results/2026-12-02-h200-s22/cpu/batch16_ab.py
# cpu_peers' pagedlm worker in each tree, alternating: ab_1thread.log
