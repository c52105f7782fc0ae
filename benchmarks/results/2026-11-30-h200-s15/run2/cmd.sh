export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 120 python3 -m pytest -q -m gpu tests/gpu/test_cuda_graphs.py tests/attention > $O/pytest_gpu.log 2>&1
tail -1 $O/pytest_gpu.log; grep -E "^(FAILED|ERROR)" $O/pytest_gpu.log | head
timeout 80 python3 benchmarks/prefill_peers.py --json $O/peers.json > $O/peers.log 2>&1; grep -E "^t[0-9]-step +triton" $O/peers.log
timeout 100 python3 benchmarks/attention_kernels.py --decode --cases decode-t0,decode-t0-qwen --json $O/decode.json > $O/decode.log 2>&1; tail -12 $O/decode.log
FWD="import sys, runpy; import pagedlm.attention.triton_paged as t; t.PREFILL_LONGEST_FIRST = False; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
timeout 100 python3 benchmarks/gpu_workloads.py --workloads T0-llama3-8b,T3-off --json $O/w_rev.json > $O/w_rev.log 2>&1
echo rev; grep -E '^\{' $O/w_rev.log | cut -c1-100
timeout 100 python3 -c "$FWD" benchmarks/gpu_workloads.py --workloads T0-llama3-8b,T3-off --json $O/w_fwd.json > $O/w_fwd.log 2>&1
echo fwd; grep -E '^\{' $O/w_fwd.log | cut -c1-100
