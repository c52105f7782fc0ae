export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 150 python3 benchmarks/first_token.py --workload L2 --host-profile $O/l2_first_token_host.txt > $O/l2_first_token.log 2>&1
timeout 80 python3 benchmarks/decode_replay.py --shape qwen3-0.6b --rounds 5 --variants base > $O/qwen_replay.log 2>&1
timeout 200 python3 benchmarks/step_timeline.py --workload T0-llama3-8b > $O/t0_llama_timeline.log 2>&1
tail -6 $O/l2_first_token.log; grep -A3 "^variant" $O/qwen_replay.log; head -40 $O/t0_llama_timeline.log | grep -v Warn
