# device call 1 (nvidia-h200), from /work/main with the spec branch archived into .dev-spec
# (git -C /work/wt-spec archive HEAD | tar -x -C /work/main/.dev-spec), carry [.dev-spec, .whl]
# (at 1d1e75f: the full uniform graphs; the default per-batch k was still 32's)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD/.dev-spec || exit; cd .dev-spec; export PYTHONUNBUFFERED=1; timeout 100 python3 -m pytest -q -m gpu tests/gpu/test_spec_decode_gpu.py "tests/gpu/test_no_sync.py::test_speculative_steps_make_no_sync" tests/gpu/test_cuda_graphs.py -p no:cacheprovider --durations=6 2>&1 | tail -40 | tee $OUT/gpu_tests.log; timeout 135 python3 benchmarks/spec_decode.py device --batches 1,8,16,32,64,128 --json $OUT/spec_device.json 2>&1 | grep -v "it/s" | tee $OUT/bench.log | tail -125
# call 2 (not run: "no device machine could be started", and the session's device time was
# down to ~340 s), for a later call at this branch's HEAD: the item-4 proposer change on CUDA and
# the A/B of the uniform steps' full graphs against the piecewise ones in one engine
# timeout 30 python3 -m pytest -q -m gpu tests/gpu/test_draft_model_gpu.py "tests/gpu/test_spec_decode_gpu.py::test_uniform_steps_replay_full_graphs_as_eager" -p no:cacheprovider
# timeout 44 python3 benchmarks/spec_decode.py device --ab --batches 1,32 --ks 3,5 --rates 0.7 --json $OUT/spec_ab.json
