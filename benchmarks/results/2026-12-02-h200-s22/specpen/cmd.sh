# CPU (the shared 2-core machine, load average ~2.7), SmolLM2-135M, copy/edit prompts, n-gram k = 4,
# 48 tokens, one torch thread; plain and speculative runs alternate, best of two each.
# this branch, every request with repetition 1.05, frequency 0.1, presence 0.1:
PYTHONPATH=/work/wt-specpen python benchmarks/spec_decode.py cpu --threads 1 --max-tokens 48 \
    --penalties 1.05,0.1,0.1 --json spec_cpu_penalties.json > spec_cpu_penalties.log
# this branch, no penalties (the same load, for comparison):
PYTHONPATH=/work/wt-specpen python benchmarks/spec_decode.py cpu --threads 1 --max-tokens 48 \
    --json spec_cpu_no_penalties.json > spec_cpu_no_penalties.log
# main (56b24a3: penalised requests decode plainly), batch 1, the same penalties (this script
# copied outside the repo so that PYTHONPATH=/work/main's pagedlm is the one imported):
PYTHONPATH=/work/main python /tmp/specpen_main/benchmarks/spec_decode.py cpu --threads 1 \
    --max-tokens 48 --batches 1 --penalties 1.05,0.1,0.1 > main_penalties_batch1.log
