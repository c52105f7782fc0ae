export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 150 python3 -m pytest -q -m gpu tests/ops/test_stage_in.py tests/ops/test_argmax.py tests/gpu/test_cuda_graphs.py > $O/pytest_gpu.log 2>&1
tail -1 $O/pytest_gpu.log; grep -E "^(FAILED|ERROR)" $O/pytest_gpu.log | head
timeout 90 python3 benchmarks/step_gaps.py --rounds 5 > $O/step_gaps.log 2>&1; grep -A7 "^mode" $O/step_gaps.log || tail -20 $O/step_gaps.log
PLAIN="import sys, runpy; import pagedlm.worker.cuda_graphs as c; c.STAGED_MAX_SIZE = 0; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
for i in 1 2; do
  timeout 60 python3 benchmarks/first_token.py --workload L2 > $O/ft_staged$i.log 2>&1; echo staged$i; grep -E "prompt  " $O/ft_staged$i.log
  timeout 60 python3 -c "$PLAIN" benchmarks/first_token.py --workload L2 > $O/ft_plain$i.log 2>&1; echo plain$i; grep -E "prompt  " $O/ft_plain$i.log
done
