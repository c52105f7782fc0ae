# 2026-12-02, s21, the lead's calls after merging rl-ipc, split, tp, spec, spec-draft, so-overlap
# (main at 426cc96 + README/DESIGN commits; serve not yet merged: it touches only the server).
# Each call starts with (call 2 forgot it: its xgrammar-less constrained no-sync failure is that):
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# call 1: pytest timed out at 75 s after 18 tests, 2 failures = test_draft_model_gpu (its test helper
#   did not move the step's input_ids to the device; fixed in the test)
timeout 75 python3 -m pytest -q -m gpu tests/gpu/test_rl_ipc_gpu.py tests/worker/test_host_offload.py tests/gpu/test_draft_model_gpu.py tests/gpu/test_no_sync.py tests/gpu/test_spec_decode_gpu.py tests/gpu/test_grammar_mask_gpu.py tests/gpu/test_split_large_batch_gpu.py -rf --tb=line > pytest_gpu_call1.log
timeout 150 python3 benchmarks/gpu_workloads.py --workloads T0-llama3-8b,L1 --json w1.json > w1.log
# call 2
timeout 80 python3 -m pytest -q -m gpu tests/gpu/test_draft_model_gpu.py --tb=short > pytest_draft_call2.log
timeout 130 python3 -m pytest -q -m gpu tests/gpu/test_no_sync.py tests/gpu/test_spec_decode_gpu.py tests/gpu/test_grammar_mask_gpu.py tests/gpu/test_split_large_batch_gpu.py -rf --tb=line > pytest_rest_call2.log
# call 3 (after the test fix): 4 passed
timeout 90 python3 -m pytest -q -m gpu tests/gpu/test_draft_model_gpu.py "tests/gpu/test_no_sync.py::test_steady_state_steps_make_no_sync" --tb=short > pytest_call3.log
# calls 4, 5
timeout 140 python3 benchmarks/gpu_workloads.py --workloads L2,T1 --json w2.json > w2.log
timeout 105 python3 benchmarks/gpu_workloads.py --workloads T0-qwen3-0.6b,T3-on --json w3.json > w3.log
