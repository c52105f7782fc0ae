export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 120 python3 benchmarks/gemm_rows_scan.py --json $O/scan.json > $O/scan.log 2>&1; tail -120 $O/scan.log | grep -v "^ *[0-9]* *[0-9.]* *[0-9.]* *[0-9.]*$" | head -70
# the T2 A/B: every graph size (as is) vs sizes <= 256 plus 384 and 512 (T2's 441-request decodes replay the 512 graph)
COARSE="import sys, runpy; import pagedlm.worker.cuda_graphs as g, pagedlm.worker.model_runner as r; f = g.capture_sizes; c = lambda s, t: [m for m in f(s, t) if m <= 256 or m % 128 == 0]; g.capture_sizes = r.capture_sizes = c; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
timeout 200 python3 -c "$COARSE" benchmarks/gpu_workloads.py --workloads T2 --json $O/w_coarse.json > $O/w_coarse.log 2>&1; echo coarse; grep -E '^\{' $O/w_coarse.log | cut -c1-100; grep "CUDA graphs:" $O/w_coarse.log
timeout 200 python3 benchmarks/gpu_workloads.py --workloads T2 --json $O/w_base.json > $O/w_base.log 2>&1; echo base; grep -E '^\{' $O/w_base.log | cut -c1-100
