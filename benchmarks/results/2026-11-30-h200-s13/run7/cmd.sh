export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 60 python3 benchmarks/decode_replay.py --shape qwen3-0.6b --rounds 5 --variants base,base+base,base+base+base,base+base+base+base > $O/qwen_replay.log 2>&1
grep -A5 "^variant" $O/qwen_replay.log
timeout 200 python3 benchmarks/gpu_workloads.py --workloads T3-on,T3-off --json $O/w.json > $O/workloads.log 2>&1
grep -E '^\{' $O/workloads.log | cut -c1-150
