"""Tensor parallelism: the process group (parallel_state), the collectives the model and the
sampler use (collectives), which part of each checkpoint tensor a rank loads (sharding), the
sampler across ranks (sampling), what a model runner needs of its rank (tp_worker) and the
shared-memory broadcast of each step's plan to the workers (shm_broadcast). The model's parallel
layers are pagedlm/model/parallel_layers.py; the worker processes, pagedlm/executor/."""
