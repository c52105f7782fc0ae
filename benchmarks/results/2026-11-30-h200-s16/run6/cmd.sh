export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 110 python3 -m pytest -q -m gpu tests/gpu/test_cuda_graphs.py -k "slow_size or kv_sizing or fp32_graph_tokens" > $O/pytest_gpu.log 2>&1
tail -1 $O/pytest_gpu.log; grep -E "^(FAILED|ERROR)|^E " $O/pytest_gpu.log | head
