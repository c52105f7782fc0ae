export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 100 python3 -m pytest -q -m gpu tests/gpu/test_piecewise_graphs.py > $O/pytest_piecewise.log 2>&1
tail -2 $O/pytest_piecewise.log; grep -E "^E " $O/pytest_piecewise.log | head -6
D='{"cudagraph_mode": "FULL_DECODE_ONLY"}'
timeout 70 python3 benchmarks/first_token.py --workload L2 > $O/ft_a_default.log 2>&1
PAGEDLM_PIECEWISE_FIRST=1 timeout 70 python3 benchmarks/first_token.py --workload L2 > $O/ft_b_piecewise_first.log 2>&1
timeout 70 python3 benchmarks/first_token.py --workload L2 --engine-args "$D" > $O/ft_c_decode_only.log 2>&1
PAGEDLM_PIECEWISE_FIRST=1 timeout 70 python3 benchmarks/first_token.py --workload L2 > $O/ft_d_piecewise_first.log 2>&1
for x in a_default b_piecewise_first c_decode_only d_piecewise_first; do echo $x; grep -A2 "step µs" $O/ft_$x.log; done
timeout 90 python3 benchmarks/decode_replay.py --shape qwen3-0.6b --rounds 5 --variants base,base+base,base+base+base,base+base+base+base > $O/qwen_replay.log 2>&1
grep -A5 "^variant" $O/qwen_replay.log
