# device call (nvidia-h200), from /work/main with the spec branch archived into .dev-spec
# (git -C /work/wt-spec archive HEAD | tar -x -C /work/main/.dev-spec), carry [.dev-spec, .whl]
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD/.dev-spec || exit; cd .dev-spec; export PYTHONUNBUFFERED=1; timeout 70 python3 -m pytest -q -m gpu "tests/gpu/test_no_sync.py::test_speculative_steps_make_no_sync" -p no:cacheprovider 2>&1 | tail -25 | tee $OUT/gpu_tests.log; timeout 200 python3 benchmarks/spec_decode.py device --json $OUT/spec_device.json 2>&1 | grep -v "it/s" | tee $OUT/bench.log | tail -48
# an earlier call (same session) ran tests/gpu/test_spec_decode_gpu.py: 2 passed
