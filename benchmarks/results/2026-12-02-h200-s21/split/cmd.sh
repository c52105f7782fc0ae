# 2026-12-02, session 21, helper split, one device call at 33e6df3 (806846d after the rebase onto baa7ead; issue 31 item 1): the split-decode
# kernel benchmark, the GPU tests (cut by their 35 s limit after 4 passing tests), then split off / on
# end to end in one process (benchmarks/split_ab.py). Defaults: LARGE_BATCH_MAX_SPLITS = 4,
# LARGE_BATCH_SPLIT_SHARE = 8; large batches run the varlen decode's pipelined loop.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
cd .dev-split && OUT=$OUT KERNELS_TIMEOUT=20 TESTS_TIMEOUT=35 AB_TIMEOUT=150 bash benchmarks/split_device.sh
# afterwards, on the CPU: python benchmarks/timeline_vs_model.py steps_off-t4.json steps_on-t4.json \
#   steps_on-t4-b8k.json > timeline_vs_model.txt
# and: python benchmarks/prefill_spread_sim.py; ... --fill --caps 256,384,512,768,1024 (prefill_spread_sim.txt)
