# session 18, run 10: the token budget's default rechecked on T0 llama3-8b: 8,192 then 16,384 (the default), one process each
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
for b in 8192 16384; do
  timeout 70 python3 benchmarks/gpu_workloads.py --workloads T0-llama3-8b --engine-args "{\"max_num_batched_tokens\": $b}" > $O/t0_$b.log 2>&1
  echo "budget $b: $(grep -E '^T0-llama3-8b' $O/t0_$b.log)"
done
