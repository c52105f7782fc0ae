# 2026-12-02, s22: vLLM 0.26.0 on S1 (pagedlm's workload, benchmarks/gpu_workloads.py), one H200.
# The bundle is now three parts (.peer/q1..q3, the repo plus a part under 64 MiB a call), three
# calls within the warm window (the peer kit's run_device.sh, copied into an ignored .peerkit):
bash .peerkit/run_device.sh check 100                          # carry .peer/q1 .peerkit
bash .peerkit/run_device.sh stage 60                           # carry .peer/q2 .peerkit
bash .peerkit/run_device.sh rest 300 "s1 mistral-7b S1" "t4 llama3-8b T4"   # carry .peer/q3 .peerkit
# S1: 1,905.72 output tok/s, 43.46 s wall (startup 78.8 s). T4 skipped at the 300 s deadline.
