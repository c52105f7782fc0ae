export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT; S="benchmarks/sampler_overhead.py --sampler-only --device cuda --repeats 7"
OLD="import sys, runpy; from pagedlm.sample import sampler as m; m._TRITON_THRESHOLD_DEVICE_TYPES = (); sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
timeout 300 python3 -m pytest -q -m gpu tests/gpu tests/worker tests/attention tests/ops tests/sample > $O/pytest_gpu.log 2>&1; tail -1 $O/pytest_gpu.log; grep -E "^(FAILED|ERROR)" $O/pytest_gpu.log | head
for shape in "256 151936" "1 128256"; do set -- $shape
timeout 60 python3 $S --num-rows $1 --vocab-size $2 > $O/sampler_new_$1.log 2>&1; echo "new $shape"; tail -7 $O/sampler_new_$1.log
timeout 60 python3 -c "$OLD" $S --num-rows $1 --vocab-size $2 > $O/sampler_old_$1.log 2>&1; echo "old (torch radix select) $shape"; tail -7 $O/sampler_old_$1.log; done
timeout 100 python3 benchmarks/sampler_overhead.py --device cuda --num-prompts 256 --input-len 32 --output-len 64 > $O/sampler_e2e.log 2>&1; tail -9 $O/sampler_e2e.log
