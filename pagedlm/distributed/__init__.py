"""Tensor parallelism: the process group (parallel_state), the collectives the model and the
sampler use (collectives), the model's parallel layers (layers), which part of each checkpoint
tensor a rank loads (sharding), the sampler across ranks (sampling) and the shared-memory
broadcast of each step's plan to the workers (shm_broadcast)."""
