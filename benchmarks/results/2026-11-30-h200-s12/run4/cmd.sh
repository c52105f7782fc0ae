export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 220 python3 benchmarks/decode_replay.py --shape qwen3-0.6b --rounds 5 --variants base,nop1,nop2,m4096x1024=8x1024s1w2,m4096x1024=4x1024s1w2,m6144x1024=4x1024s1w2,m6144x1024=2x1024s1w1,m151936x1024=8x1024s1w4,m151936x1024=32x1024s1w8,sb32,sb128,sw2,sw8 > $O/qwen_replay.log 2>&1
timeout 300 python3 benchmarks/decode_replay.py --shape llama3-8b --rounds 5 --variants base,nop1,m6144x4096=8x1024s1w4,m6144x4096=16x1024s1w4,m4096x4096=8x2048s1w8,m4096x14336=8x1024s1w4,m4096x14336=16x1024s1w8,m28672x4096=32x1024s1w8,m28672x4096=8x1024s1w4,m128256x4096=32x1024s1w8,m128256x4096=8x1024s1w4,sb32 > $O/llama_replay.log 2>&1
grep -A14 "^variant" $O/qwen_replay.log; grep -A14 "^variant" $O/llama_replay.log
