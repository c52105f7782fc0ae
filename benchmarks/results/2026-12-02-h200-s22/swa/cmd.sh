# CPU, the real Scheduler with KV cache groups (core/kv_groups.py); no device
python benchmarks/sliding_window_capacity.py --full-layers 8  > capacity_full8.log
python benchmarks/sliding_window_capacity.py --full-layers 16 > capacity_full16.log
python benchmarks/sliding_window_capacity.py --workload S1 --full-layers 8 > capacity_S1_full8.log
