export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 120 python3 -m pytest -q -m gpu tests/gpu/test_piecewise_graphs.py > $O/pytest_piecewise.log 2>&1
tail -3 $O/pytest_piecewise.log; grep -E "^E " $O/pytest_piecewise.log | head -8
D='{"cudagraph_mode": "FULL_DECODE_ONLY"}'
timeout 80 python3 benchmarks/first_token.py --workload L2 --engine-args "$D" > $O/l2_first_token_a.log 2>&1
timeout 80 python3 benchmarks/first_token.py --workload L2 > $O/l2_first_token_b.log 2>&1
timeout 80 python3 benchmarks/first_token.py --workload L2 --engine-args "$D" > $O/l2_first_token_c.log 2>&1
for x in a b c; do grep -A3 "median of" $O/l2_first_token_$x.log; done
timeout 150 python3 benchmarks/gpu_workloads.py --workloads T1,T0-qwen3-0.6b --json $O/w.json > $O/workloads.log 2>&1
grep -E '^\{' $O/workloads.log | cut -c1-150
