# 2026-12-02, session 22, helper t4 (issue 31 item 1), two H200 calls at 191253d ("benchmarks:
# spread_ab.py"), the branch archived into /work/main/.dev-t4 (carry .dev-t4 .whl).
# Call 1 (timeout_s 250, wall 238 s): the split GPU tests (cut at 35 s after 2 passing), then one
# engine with the split decode on: T4 with the prefill spread (then the default, on), T4 without it
# (t4-plain), T0-llama3-8b; T2 was cut by the 200 s limit.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
cd .dev-t4 && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 35 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_split_large_batch_gpu.py > $OUT/gpu_tests.log 2>&1
timeout 200 python3 benchmarks/spread_ab.py --out $OUT/ab --plan "on:t4,t4-plain,T0-llama3-8b,T2" > $OUT/ab.log 2>&1
# Call 2 (timeout_s 180, wall 166 s, a fresh machine): the split-decode kernels (split-next's
# balanced_splits against varlen), then T2 with the split on (cut by the 150 s limit: no figure).
timeout 22 python3 benchmarks/split_decode.py --cases t2,t0,t4-24,t4-256 --json $OUT/split_decode.json > $OUT/kernels.log 2>&1
timeout 150 python3 benchmarks/spread_ab.py --out $OUT/ab --plan "on:T2" > $OUT/ab.log 2>&1
# afterwards, on the CPU:
#   python benchmarks/timeline_vs_model.py call1/steps_on-t4.json call1/steps_on-t4-plain.json > timeline_vs_model.txt
#   python benchmarks/prefill_spread_sim.py --scheduler --workloads T4,T1,T0-llama3-8b,T3-off > spread_sim.txt
