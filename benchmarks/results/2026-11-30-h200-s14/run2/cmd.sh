export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 200 python3 -m pytest -q -m gpu tests/ops/test_stage_in.py tests/ops/test_argmax.py tests/gpu/test_cuda_graphs.py tests/gpu/test_no_sync.py tests/worker > $O/pytest_gpu.log 2>&1
tail -2 $O/pytest_gpu.log; grep -E "^(FAILED|ERROR)" $O/pytest_gpu.log | head
PLAIN="import sys, runpy; import pagedlm.worker.cuda_graphs as c; c.STAGED_MAX_SIZE = 0; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
for i in 1 2; do
  timeout 60 python3 benchmarks/first_token.py --workload L2 > $O/ft_staged$i.log 2>&1; echo staged$i; grep -E "prompt  " $O/ft_staged$i.log
  timeout 60 python3 -c "$PLAIN" benchmarks/first_token.py --workload L2 > $O/ft_plain$i.log 2>&1; echo plain$i; grep -E "prompt  " $O/ft_plain$i.log
done
timeout 60 python3 benchmarks/gpu_workloads.py --workloads L2 --json $O/w_staged.json > $O/w_staged.log 2>&1; grep -E '^\{' $O/w_staged.log | cut -c1-150
timeout 60 python3 -c "$PLAIN" benchmarks/gpu_workloads.py --workloads L2 --json $O/w_plain.json > $O/w_plain.log 2>&1; grep -E '^\{' $O/w_plain.log | cut -c1-150
timeout 60 python3 benchmarks/step_timeline.py --workload L2 --one-step > $O/l2_timeline.log 2>&1
grep -A14 "^one step" $O/l2_timeline.log | head -16; grep -B1 -A8 "^idle" $O/l2_timeline.log | head -12
