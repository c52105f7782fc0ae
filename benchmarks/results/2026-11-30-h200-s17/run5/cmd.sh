export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT; S="benchmarks/sampler_overhead.py --sampler-only --device cuda --repeats 7"
timeout 150 python3 -m pytest -q -m gpu tests/sample tests/gpu/test_engine_bf16_and_async.py > $O/pytest_gpu.log 2>&1; tail -1 $O/pytest_gpu.log; grep -E "^(FAILED|ERROR)" $O/pytest_gpu.log | head
for shape in "256 151936" "1 128256"; do set -- $shape
timeout 60 python3 $S --num-rows $1 --vocab-size $2 > $O/sampler_new_$1.log 2>&1; echo "new $shape"; tail -7 $O/sampler_new_$1.log; done
