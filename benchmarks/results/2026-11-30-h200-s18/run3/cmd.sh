# session 18, run 3: the qwen3-0.6b workloads at e995816, and transformers' generate on T0 (the peer)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 300 python3 benchmarks/gpu_workloads.py --workloads L2,T0-qwen3-0.6b,T1,T0-llama3-8b --peer --json $O/w3.json > $O/w3.log 2>&1; tail -8 $O/w3.log | cut -c1-200
