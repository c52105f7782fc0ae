export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 280 python3 -m pytest -q -m gpu tests/gpu tests/worker tests/attention tests/ops > $O/pytest_gpu.log 2>&1
timeout 250 python3 benchmarks/gpu_workloads.py --workloads L2,L1 --json $O/w.json > $O/workloads.log 2>&1
timeout 120 python3 benchmarks/decode_replay.py --shape qwen3-0.6b --rounds 5 --variants base,m4096x1024=4x1024s1w1,m151936x1024=16x1024s1w4 > $O/qwen_replay.log 2>&1
tail -3 $O/pytest_gpu.log; tail -4 $O/workloads.log; grep -A4 "^variant" $O/qwen_replay.log
