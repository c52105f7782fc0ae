# the shared 2-core CPU machine, loaded (load average ~12 from other helpers' work): absolute
# tok/s are far below the idle figures (33.3 tok/s batch 1); plain and speculative runs
# alternate, best of two each, one torch thread
PYTHONPATH=/work/wt-spec /work/main/.venv/bin/python benchmarks/spec_decode.py cpu --threads 1 --max-tokens 48 --json spec_cpu.json
