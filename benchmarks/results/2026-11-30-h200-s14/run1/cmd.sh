export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 220 python3 -m pytest -q -m gpu tests/gpu tests/worker tests/attention tests/ops tests/sample > $O/pytest_gpu.log 2>&1
tail -2 $O/pytest_gpu.log; grep -E "^(FAILED|ERROR)" $O/pytest_gpu.log | head
timeout 120 python3 benchmarks/decode_replay.py --shape qwen3-0.6b --rounds 5 --variants base,sp1,sp2,sp4,sb32,sp1+sw8,base+base > $O/qwen_replay.log 2>&1
grep -A8 "^variant" $O/qwen_replay.log || tail -20 $O/qwen_replay.log
timeout 60 python3 benchmarks/first_token.py --workload L2 > $O/first_token.log 2>&1
tail -6 $O/first_token.log
