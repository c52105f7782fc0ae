# 2026-12-02 s23, call 2 at main 3066bcb (+ the probe): why the re-capture sleep test fails after a
# keep-address engine (call 1); the rest of the fixed workloads; S1 (never run by pagedlm on the
# H200; vLLM 1,905.7 tok/s in s22); the draft-model and uniform-steps spec GPU tests.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; O=$OUT
for m in alone after_keep; do timeout 45 python3 benchmarks/probes/sleep_recapture_probe.py $m 2>&1 | grep -v INFO > $O/probe_$m.log; echo "probe $m rc=$?"; cat $O/probe_$m.log | cut -c1-200 | tail -12; done
timeout 230 python3 benchmarks/gpu_workloads.py --workloads L2,T1,T0-qwen3-0.6b,T3-on --json $O/w2.json > $O/w2.log 2>&1; echo "w2 rc=$?"
timeout 170 python3 benchmarks/gpu_workloads.py --workloads S1 --json $O/s1.json > $O/s1.log 2>&1; echo "s1 rc=$?"
timeout 50 python3 -m pytest -q -m gpu tests/gpu/test_draft_model_gpu.py "tests/gpu/test_spec_decode_gpu.py::test_uniform_steps_replay_full_graphs_as_eager" -p no:cacheprovider > $O/spec_tests.log 2>&1; echo "spec rc=$?"; tail -3 $O/spec_tests.log
grep -hE "^[LTS][0-9].* [0-9.]+ +[0-9.]+ +[0-9.]+$" $O/w2.log $O/s1.log
