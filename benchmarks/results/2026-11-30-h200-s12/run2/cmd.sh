export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
A=m1024x2048=2x2048s1w2+m1024x3072=4x4096s1w4
timeout 200 python3 benchmarks/decode_replay.py --shape qwen3-0.6b --rounds 5 --variants base,$A,m1024x2048=2x2048s1w2+m1024x3072=2x4096s1w4,m1024x2048=8x2048s1w4+m1024x3072=4x4096s1w4,m1024x2048=2x2048s1w2+m1024x3072=8x4096s1w8,m1024x2048=1x2048s1w2+m1024x3072=1x4096s1w4,$A+m4096x1024=8x1024s1w2,$A+m6144x1024=8x1024s1w2,$A+m151936x1024=8x1024s1w4,$A+m151936x1024=16x1024s1w4,m1024x2048=4x2048s1w4+m1024x3072=4x4096s1w8 > $O/qwen_replay.log 2>&1
a=fmak16384+m4096x14336=8x2048s1w8
timeout 300 python3 benchmarks/decode_replay.py --shape llama3-8b --rounds 5 --variants base,$a,fmak16384+m4096x14336=16x2048s1w8,fmak16384+m4096x14336=4x2048s1w8,fmak16384+m4096x14336=8x2048s2w8,fmak16384+m4096x14336=8x4096s1w16,$a+m28672x4096=8x2048s1w8,$a+m28672x4096=16x1024s1w4,$a+m6144x4096=8x2048s1w8,$a+m128256x4096=8x2048s1w8,$a+m128256x4096=16x1024s1w4 > $O/llama_replay.log 2>&1
grep -A14 "^variant" $O/qwen_replay.log; grep -A14 "^variant" $O/llama_replay.log
