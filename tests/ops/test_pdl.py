"""When kernels launch with programmatic dependent launch (pagedlm/ops/pdl.py). That the kernels
wait before they read their producer's output is checked in their sm_90 PTX
(tests/attention/test_triton_aot.py) and on the GPU (tests/gpu/test_kernels_gpu.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from pagedlm.ops import pdl


def test_off_on_cpu() -> None:
    assert pdl.launch_args(torch.device("cpu")) == {"PDL": False, "launch_pdl": False}


def test_off_under_the_interpreter_even_for_cuda_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interpreter cannot run griddepcontrol: TRITON_INTERPRET=1 with CUDA tensors on an H200
    must launch without PDL (no device is asked: the interpreter check comes first)."""
    monkeypatch.setattr(pdl, "INTERPRETED", True)
    monkeypatch.setattr(pdl, "_device_supports_pdl", lambda index: True)
    assert not pdl.pdl_enabled(torch.device("cuda", 0))
    monkeypatch.setattr(pdl, "INTERPRETED", False)
    monkeypatch.setattr(torch.version, "hip", None)
    assert pdl.pdl_enabled(torch.device("cuda", 0))
    monkeypatch.setattr(pdl, "ENABLED_BY_ENV", False)  # PAGEDLM_PDL=0
    assert not pdl.pdl_enabled(torch.device("cuda", 0))


def test_the_switches_are_read_through_the_registry() -> None:
    """PAGEDLM_PDL and TRITON_INTERPRET as pagedlm/envs.py parses them ("off" is off; "true" is
    Triton's true), read once, at import."""
    code = "from pagedlm.ops import pdl; print(pdl.ENABLED_BY_ENV, pdl.INTERPRETED)"
    env = {**os.environ, "PAGEDLM_PDL": "off", "TRITON_INTERPRET": "true"}
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert result.stdout.split() == ["False", "True"]
