export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
PLAIN="import sys, runpy; import pagedlm.worker.cuda_graphs as c; c.STAGED_MAX_SIZE = 0; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
for i in 1 2; do
  timeout 80 python3 benchmarks/gpu_workloads.py --workloads T1,T0-qwen3-0.6b,L2 --json $O/w_staged$i.json > $O/w_staged$i.log 2>&1
  echo staged$i; grep -E '^\{' $O/w_staged$i.log | cut -c1-110
  timeout 80 python3 -c "$PLAIN" benchmarks/gpu_workloads.py --workloads T1,T0-qwen3-0.6b,L2 --json $O/w_plain$i.json > $O/w_plain$i.log 2>&1
  echo plain$i; grep -E '^\{' $O/w_plain$i.log | cut -c1-110
done
