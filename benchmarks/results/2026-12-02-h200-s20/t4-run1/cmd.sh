# 2026-12-02, session 20, helper t4, one device call at a4aff9a (issue 31 items 1 and 3):
# T4 offline with a step log (as defined; then max_num_batched_tokens 8k, 2k, 2k longest-first: those
# three took every prompt from the prefix cache, the first run's, so they time T4's decode side alone;
# skewed_timeline.py now salts each run), serve_gpu.sh's prompts offline; then serving (it failed at
# import: /work/main/.whl's fastapi 0.165 needs opentelemetry-api, absent on the device).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
cd .dev-t4 && OUT=$OUT T4_TIMEOUT=270 SERVE_TIMEOUT=210 bash benchmarks/t4_device.sh
# then, on the CPU:  python benchmarks/timeline_vs_model.py steps_t4.json steps_t4-b8k.json steps_serve-offline.json
