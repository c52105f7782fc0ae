# session 18, run 4: fresh_prefill_probe.py (new): contiguous-K/V TMA attention against our paged kernel and cuDNN
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 400 python3 benchmarks/fresh_prefill_probe.py --json $O/probe.json > $O/probe.log 2>&1; grep -E "error" $O/probe.log | cut -c1-300 | head -5; grep -A40 "^case" $O/probe.log
