"""The compile watch: its hooks record compiles and warn only while serving (CPU, hooks called as
Triton calls them); on CUDA, a real compile is seen, and run-time ints that vary from step to step
(GEMV rows, split counts) do not make new specialisations."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl

from pagedlm.ops.jit_watch import CompileWatch, compile_watch


def _compile(watch: CompileWatch, key: str, name: str) -> None:
    """What Triton's JITFunction._do_compile does around a compile (the hook data of 3.6)."""
    data = {
        "key": key,
        "signature": {"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
        "constants": {(2,): 128},
        "configs": [{(0,): [["tt.divisibility", 16]]}],
        "num_warps": 4,
        "num_stages": 3,
    }
    for hook in (watch._before, watch._after):
        hook(
            key=key,
            repr=f"{name}[num_warps=4](...)",
            fn=SimpleNamespace(name=name),
            compile=data,
            is_manual_warmup=False,
            already_compiled=False,
        )


def test_events_and_warnings_only_while_serving(caplog: pytest.LogCaptureFixture) -> None:
    watch = CompileWatch()
    first = watch.start_up()
    with caplog.at_level(logging.WARNING, logger="pagedlm"):
        _compile(watch, "k1", "start_kernel")
        watch.serving()
        _compile(watch, "k2", "late_kernel")
    assert [e.kernel for e in watch.since(first)] == ["start_kernel", "late_kernel"]
    assert [e.while_serving for e in watch.events] == [False, True]
    assert all(e.seconds >= 0 for e in watch.events)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "late_kernel" in warnings[0]
    assert "(x_ptr: *fp32/16, n: i32, BLOCK=128) num_warps=4 num_stages=3" in warnings[0]
    second_engine = watch.start_up()  # a new engine's start-up compiles are not warnings
    _compile(watch, "k3", "next_engine_kernel")
    assert watch.since(second_engine)[0].while_serving is False


def test_the_process_count_of_compiles_while_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    from pagedlm.ops import jit_watch

    monkeypatch.setattr(jit_watch, "_watch", None)
    assert (
        jit_watch.num_compiles_while_serving() == 0
    )  # no engine watches: nothing installed either
    watch = CompileWatch()
    monkeypatch.setattr(jit_watch, "_watch", watch)
    _compile(watch, "k1", "start_kernel")
    watch.serving()
    _compile(watch, "k2", "late_kernel")
    _compile(watch, "k3", "later_kernel")
    assert jit_watch.num_compiles_while_serving() == 2


@triton.jit
def _scale_kernel(out_ptr, x_ptr, n, FACTOR: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * FACTOR, mask=offs < n)


@pytest.mark.gpu
def test_a_real_compile_is_seen_once() -> None:
    watch = compile_watch()
    first = len(watch.events)
    x = torch.randn(100, device="cuda")
    out = torch.full_like(x, float("nan"))
    for _ in range(2):
        _scale_kernel[(1,)](out, x, 100, FACTOR=3.0, BLOCK=128)
    torch.testing.assert_close(out, x * 3.0)
    (event,) = watch.since(first)  # the second launch found the compiled kernel
    assert event.kernel == "_scale_kernel" and event.seconds > 0


@pytest.mark.gpu
def test_step_varying_ints_make_no_new_specialisation() -> None:
    """GEMV rows 2..8 on the dot path share one compile; so do split-decode split counts."""
    from pagedlm.ops.gemv import gemv_triton

    watch = compile_watch()
    weight = torch.randn(1000, 3000, device="cuda", dtype=torch.bfloat16)
    gemv_triton(torch.randn(2, 3000, device="cuda", dtype=torch.bfloat16), weight)
    first = len(watch.events)
    for num_rows in (3, 5, 6, 7, 8):
        x = torch.randn(num_rows, 3000, device="cuda", dtype=torch.bfloat16)
        torch.testing.assert_close(
            gemv_triton(x, weight).float(), (x.float() @ weight.float().T), rtol=2e-2, atol=2e-1
        )
    late = [f"{e.kernel}{e.signature}" for e in watch.since(first)]
    assert not late, "compiled again:\n" + "\n".join(late)
