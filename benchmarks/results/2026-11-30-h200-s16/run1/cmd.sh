export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 100 python3 benchmarks/decode_gemm_probe.py --split-k-only --rows 256,448,512 --json $O/splitk.json > $O/splitk.log 2>&1; tail -25 $O/splitk.log
timeout 100 python3 benchmarks/overlap_probe.py --json $O/overlap.json > $O/overlap.log 2>&1; tail -20 $O/overlap.log
timeout 300 python3 -m pytest -q -m gpu tests/gpu tests/worker tests/attention tests/ops tests/sample > $O/pytest_gpu.log 2>&1
tail -1 $O/pytest_gpu.log; grep -E "^(FAILED|ERROR)" $O/pytest_gpu.log | head
