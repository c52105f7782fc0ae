# 2026-12-02 s24, call 5 at the draftg merge + s24's worker changes: the batch-1 and host-bound
# fixed workloads again (graph metadata and padding per KV cache group, the shared capture helper).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 330 python3 benchmarks/gpu_workloads.py --workloads L2,T0-qwen3-0.6b,L1 --json $O/w.json > $O/w.log 2>&1; echo "workloads rc=$?"; grep -v "^INFO\|^WARNING" $O/w.log | tail -8 | cut -c1-200
