export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv > $O/gpu.txt
timeout 170 python3 benchmarks/decode_replay.py --shape qwen3-0.6b --rounds 5 --variants base,m1024x2048=4x2048s1w2,m1024x3072=4x4096s1w4,m1024x2048=4x2048s1w2+m1024x3072=4x4096s1w4,m1024x2048=8x2048s1w4,m1024x2048=2x2048s1w2 > $O/qwen_replay.log 2>&1
timeout 230 python3 benchmarks/decode_replay.py --shape llama3-8b --rounds 5 --variants base,m4096x4096=16x1024s1w4,m4096x4096=8x1024s1w4,m4096x4096=16x2048s1w8,fmak16384+m4096x14336=8x2048s1w8,fmak16384+m4096x14336=16x1024s1w4 > $O/llama_replay.log 2>&1
timeout 100 python3 benchmarks/step_timeline.py --workload L2 --one-step --output-len 64 > $O/l2_timeline.log 2>&1
tail -12 $O/qwen_replay.log; tail -12 $O/llama_replay.log; head -30 $O/l2_timeline.log
