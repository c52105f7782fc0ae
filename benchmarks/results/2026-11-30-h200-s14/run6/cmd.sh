export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 170 python3 benchmarks/gemm_fusion_probe.py --skip-ws --rows 16384,2048 --rounds 3 --json $O/probe.json > $O/probe.log 2>&1
tail -16 $O/probe.log
timeout 80 python3 benchmarks/gemm_fusion_probe.py --shapes gate_up,o --rows 16384 --rounds 3 --json $O/probe_ws.json > $O/probe_ws.log 2>&1
tail -9 $O/probe_ws.log
