# session 18, run 8: T3-on with the largest decode graph 512 (before c9875c4) and 1,024, alternating, one process each
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
i=0
for cap in 512 1024 512 1024; do
  i=$((i + 1))
  timeout 70 python3 -c "import sys, runpy; import pagedlm.worker.cuda_graphs as m; m.MAX_CAPTURE_SIZE = int(sys.argv[1]); sys.argv = sys.argv[2:]; runpy.run_path(sys.argv[0], run_name='__main__')" $cap benchmarks/gpu_workloads.py --workloads T3-on > $O/t3on_${i}_cap$cap.log 2>&1
  echo "$i cap $cap: $(grep -E '^T3-on' $O/t3on_${i}_cap$cap.log)"
done
