"""Programmatic dependent launch (PDL, Hopper and later): a kernel may start while the kernel before
it on the stream is still running, and waits for it only where it reads that kernel's output.

A batch-1 decode step is ~300 launches of 1-8 µs each; without PDL each one pays its launch, its
first memory round trips and the previous kernel's tail in series. With PDL a kernel's programs
become resident as the previous kernel winds down and do the work that needs nothing from it
(a GEMV loads its first weight tile; attention reads the block table) before they wait.

The rule every kernel launched with PDL keeps (`wait_for_producers` is where it switches):
1. Before the wait it only reads, and only data that the kernel just before it does not write:
   weights, the step's inputs (copied in before the step's first kernel), and, in the split decode,
   KV that earlier steps wrote (core/kv_cache_manager.py keeps a one-token query off blocks that
   another sequence fills in the same step). So a caller of the
   attention or prepare_qkv wrappers must not produce their metadata (query_start_loc, seq_lens,
   block_table, positions, slot_mapping) with the kernel it launches right before them.
2. At the wait (griddepcontrol.wait) it blocks until the previous kernel has finished and its
   writes are visible; only then does it read activations or write anything.
3. Right after the wait it lets the next kernel launch (griddepcontrol.launch_dependents), and every
   program reaches the wait, even one with nothing to do (an exit before it would count as a
   launch_dependents). So when a kernel starts, every kernel two or more launches back has
   finished: rule 1's "inputs copied in before the step" holds however long the chain of PDL
   launches is.
A kernel launched without PDL (cuBLAS, torch) starts after everything before it, as always.

On by default where the device supports it; PAGEDLM_PDL=0 turns it off (for A/B measurements).
Off on CPU, on ROCm and under the Triton interpreter (the constexpr compiles the instructions out).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from pagedlm import envs

MIN_CAPABILITY = 9  # griddepcontrol: sm_90 and later
ENABLED_BY_ENV = envs.PAGEDLM_PDL  # read once: launch_args runs at every launch
INTERPRETED = envs.TRITON_INTERPRET


@functools.cache
def _device_supports_pdl(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= MIN_CAPABILITY


def pdl_enabled(device: torch.device) -> bool:
    """Whether kernels on `device` launch with PDL: NVIDIA sm_90+, not under the Triton interpreter
    (which cannot run griddepcontrol, even on CUDA tensors)."""
    if device.type != "cuda" or not ENABLED_BY_ENV or torch.version.hip is not None or INTERPRETED:
        return False
    return _device_supports_pdl(
        device.index if device.index is not None else torch.cuda.current_device()
    )


def launch_args(device: torch.device) -> dict[str, bool]:
    """Keyword arguments for a kernel launch: the kernel's PDL constexpr and Triton's launch option."""
    enabled = pdl_enabled(device)
    return {"PDL": enabled, "launch_pdl": enabled}


@triton.jit
def wait_for_producers(PDL: tl.constexpr):
    """Rules 2 and 3 of the module notes; nothing when PDL is off."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
