export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 90 python3 benchmarks/attention_kernels.py --mixed > $O/mixed.log 2>&1; grep -vE '^\{' $O/mixed.log | tail -22
timeout 90 python3 benchmarks/attention_kernels.py --decode --cases decode-t1,decode-t2,decode-t0 --configs 64x4x2,64x4x3,32x4x2 --json $O/decode.json > $O/decode.log 2>&1; tail -12 $O/decode.log
timeout 300 python3 benchmarks/gpu_workloads.py --workloads T2,T3-on --json $O/w.json > $O/workloads.log 2>&1
tail -3 $O/workloads.log
