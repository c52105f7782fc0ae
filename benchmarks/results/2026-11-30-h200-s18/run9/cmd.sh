# session 18, run 9: fresh_prefill_probe.py after the PromptCase refactor (e38fb54), one case
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; O=$OUT
timeout 90 python3 benchmarks/fresh_prefill_probe.py --cases t0-step > $O/probe.log 2>&1; grep -E "error" $O/probe.log | cut -c1-200 | head -3; grep -A12 "^case" $O/probe.log
