# 2026-12-02, session 20, helper split, one device call at d0f3d8d (7e37ee0 after the rebase; issue 31 item 1): the split-decode
# kernel benchmark, T4 / T0-llama3-8b / L1, then the GPU tests (cut by their 70 s limit; two failures
# were a test bug: decode_order left on the host, fixed after).
# Measured with LARGE_BATCH_MAX_SPLITS = 8, LARGE_BATCH_SPLIT_SHARE = 4 ("engine S8 top1/4" rows); the
# default then became 4 and 8 (the kernel sweep's best), not re-measured end to end.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
cd .dev-split && OUT=$OUT KERNELS_TIMEOUT=50 WORKLOADS_TIMEOUT=150 TESTS_TIMEOUT=70 bash benchmarks/split_device.sh
