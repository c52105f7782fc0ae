export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
V1=m4096x1024=4x1024s1w1; V2=m151936x1024=16x1024s1w4
timeout 120 python3 benchmarks/decode_replay.py --shape qwen3-0.6b --rounds 5 --variants base,$V1,base+base,$V2,$V1+$V2 > $O/qwen_replay_a.log 2>&1
timeout 120 python3 benchmarks/decode_replay.py --shape qwen3-0.6b --rounds 5 --variants $V1+$V2,base,$V2,base+base,$V1 > $O/qwen_replay_b.log 2>&1
timeout 200 python3 benchmarks/gpu_workloads.py --workloads T1,L2 --json $O/w.json > $O/workloads.log 2>&1
grep -A6 "^variant" $O/qwen_replay_a.log; grep -A6 "^variant" $O/qwen_replay_b.log; tail -3 $O/workloads.log
