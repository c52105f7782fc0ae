"""Probe: GPU time of torch.argmax over one row of logits (in a CUDA graph) vs a two-stage Triton argmax."""
import torch, triton, triton.language as tl

@triton.jit
def stage1(x_ptr, part_ptr, V, stride, C: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0); c = tl.program_id(1)
    best = tl.full([BLOCK], float("-inf"), tl.float32); bidx = tl.zeros([BLOCK], tl.int32)
    for start in range(c * BLOCK, V, C * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride + offs, mask=offs < V, other=float("-inf"))
        upd = x > best
        best = tl.where(upd, x, best); bidx = tl.where(upd, offs, bidx)
    m = tl.max(best, 0)
    i = tl.min(tl.where(best == m, bidx, 2**30), 0)
    tl.store(part_ptr + (row * C + c) * 2, m)
    tl.store(part_ptr + (row * C + c) * 2 + 1, i.to(tl.float32))  # probe only

@triton.jit
def stage2(part_ptr, out_ptr, C: tl.constexpr):
    row = tl.program_id(0); offs = tl.arange(0, C)
    m = tl.load(part_ptr + (row * C + offs) * 2); i = tl.load(part_ptr + (row * C + offs) * 2 + 1)
    mm = tl.max(m, 0)
    tl.store(out_ptr + row, tl.min(tl.where(m == mm, i, 3e9), 0).to(tl.int64))

def graph_time(fn, reps=200):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn(); fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps): fn()
    g.replay(); torch.cuda.synchronize()
    a, b = torch.cuda.Event(True), torch.cuda.Event(True)
    ts = []
    for _ in range(5):
        a.record(); g.replay(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b) * 1e3 / reps)
    return min(ts)

for V in (128256, 151936):
    for rows in (1, 4, 8):
        x = torch.randn(rows, V, device="cuda")
        out = torch.empty(rows, dtype=torch.int64, device="cuda")
        t_torch = graph_time(lambda: torch.argmax(x, dim=-1, out=out))
        res = {}
        for C, BLOCK in ((32, 1024), (64, 1024), (128, 512), (132, 1024)):
            part = torch.empty(rows * C * 2, device="cuda")
            def tri():
                stage1[(rows, C)](x, part, V, x.stride(0), C=C, BLOCK=BLOCK)
                stage2[(rows,)](part, out, C=triton.next_power_of_2(C) if False else C)
            if C & (C - 1):
                continue
            tri(); torch.cuda.synchronize()
            assert torch.equal(out, x.argmax(-1)), (out, x.argmax(-1))
            res[(C, BLOCK)] = graph_time(tri)
        print(f"V={V} rows={rows}: torch.argmax {t_torch:.1f} us; triton two-stage " +
              ", ".join(f"C{c}xB{b} {t:.1f}" for (c, b), t in res.items()), flush=True)
