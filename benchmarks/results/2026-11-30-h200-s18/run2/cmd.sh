# session 18, run 2: the llama3-8b workloads at e995816 (the final table of the session)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv > $O/device.txt
timeout 280 python3 benchmarks/gpu_workloads.py --workloads T2,T0-llama3-8b,L1 --json $O/w1.json > $O/w1.log 2>&1; grep -E " -> " $O/w1.log | cut -c1-200 | head -4; tail -5 $O/w1.log | cut -c1-200
timeout 200 python3 benchmarks/gpu_workloads.py --workloads T3-off,T3-on --json $O/w2.json > $O/w2.log 2>&1; tail -4 $O/w2.log | cut -c1-200
