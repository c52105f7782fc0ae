# session 18, run 6: decode graphs up to 1,024 (max_num_seqs' default): graph tests, then qwen3-0.6b with
# 1,024 requests x 128 / 256 through bench throughput, the largest graph 512 (as before) and 1,024, alternating
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 240 python3 -m pytest -q -m gpu tests/gpu/test_cuda_graphs.py tests/gpu/test_piecewise_graphs.py tests/gpu/test_no_sync.py > $O/pytest_graphs.log 2>&1; tail -1 $O/pytest_graphs.log; grep -E "^(FAILED|ERROR)" $O/pytest_graphs.log
Q=$(python3 benchmarks/gpu_workloads.py --write-model qwen3-0.6b)
for cap in 512 1024 512 1024; do
  timeout 100 python3 -c "import sys, runpy; import pagedlm.worker.cuda_graphs as m; m.MAX_CAPTURE_SIZE = int(sys.argv[1]); sys.argv = ['pagedlm'] + sys.argv[2:]; runpy.run_module('pagedlm.cli', run_name='__main__')" $cap bench throughput --model $Q --load-format dummy --skip-tokenizer-init --dtype bfloat16 --num-prompts 1024 --input-len 128 --output-len 256 > $O/thr_cap$cap.$RANDOM.log 2>&1
done
for f in $O/thr_cap*.log; do echo "$f: $(grep -E 'CUDA graphs: ' $f | cut -c1-230 | head -2 | tr '\n' ' ')"; grep -E "^Throughput|Error" $f; done
