"""GPU: can a decode step's attention (memory-bound) and its GEMMs (compute-bound) share the GPU?
The question behind NanoFlow-style nano-batches, asked before building them.

    python benchmarks/probes/overlap_probe.py [--cases t2,t0] [--json out.json]

A decode layer of llama3-8b at a batch of B sequences: the Triton paged decode attention over their
contexts and the layer's four cuBLAS GEMMs at B rows (qkv, o, gate_up, down; bf16, random weights).
Timed per layer (CUDA events, LAYERS layers back to back, so the weights come from DRAM as in a step):
  serial           attention(B), then the GEMMs at B rows: today's step
  serial halves    attention(B/2), GEMMs(B/2), twice: what splitting alone costs (smaller GEMMs)
  overlap          attention(first half) on a side stream beside GEMMs(second half) on the main
                   stream, then the halves swapped: a two-nano-batch pipeline's steady state
  overlap, attn hi the same with the side stream at high priority
  attention alone, gemms alone   each part of "serial" by itself
The data dependencies of a real pipeline (a half's GEMMs after its attention) are not modelled: the
probe asks only whether the two kinds of kernels run faster together than one after the other.
Outputs are not checked (attention_kernels.py and the GPU tests check the kernels).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path[:0] = [
    str(p) for p in Path(__file__).resolve().parents[:3]
]  # probes/, benchmarks/, the repo

from attention_kernels import HEAD_DIM, make_case, time_ms  # noqa: E402

from pagedlm.attention import triton_paged  # noqa: E402

CASES = {  # name: (sequences, context tokens)
    "t2": (448, 1500),  # T2's decode steps mid-run (KV capacity holds ~441 sequences)
    "t0": (256, 576),  # T0 llama3-8b's decode steps
}
HIDDEN, INTER, NUM_HEADS, NUM_KV_HEADS = 4096, 14336, 32, 8
LAYERS = 8  # layers of weights cycled through: 8 x 436 MB, past the 60 MB L2


def layer_weights(device: str) -> list[list[torch.Tensor]]:
    """LAYERS x [qkv, o, gate_up, down] bf16 weights of llama3-8b's shapes."""
    shapes = [
        ((NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM, HIDDEN),
        (HIDDEN, NUM_HEADS * HEAD_DIM),
        (2 * INTER, HIDDEN),
        (HIDDEN, INTER),
    ]
    return [
        [torch.randn(n, k, device=device, dtype=torch.bfloat16) / k**0.5 for n, k in shapes]
        for _ in range(LAYERS)
    ]


def gemms(x: torch.Tensor, x_inter: torch.Tensor, weights: list[torch.Tensor]) -> None:
    """The layer's four GEMMs at x's rows (x_inter: down_proj's input, as wide as the MLP)."""
    qkv, o, gate_up, down = weights
    F.linear(x, qkv)
    F.linear(x, o)
    F.linear(x, gate_up)
    F.linear(x_inter, down)


def attention_of(num_seqs: int, context: int):
    """A call running the decode attention of num_seqs sequences over `context` keys each."""
    q, kv_cache, meta, _, _ = make_case(num_seqs, context - 1, 1, NUM_HEADS, NUM_KV_HEADS)
    out = torch.empty_like(q)
    return lambda: triton_paged.varlen_attention(q, kv_cache, meta, HEAD_DIM**-0.5, None, out=out)


def variants(num_seqs: int, context: int) -> dict[str, object]:
    """label -> a call running LAYERS layers of that schedule (or of one part alone)."""
    weights = layer_weights("cuda")
    full_attention, half_attention = (
        attention_of(num_seqs, context),
        attention_of(num_seqs // 2, context),
    )
    x_full = torch.randn(num_seqs, HIDDEN, device="cuda", dtype=torch.bfloat16)
    inter_full = torch.randn(num_seqs, INTER, device="cuda", dtype=torch.bfloat16)
    x_half, inter_half = x_full[: num_seqs // 2], inter_full[: num_seqs // 2]
    side_low, side_high = torch.cuda.Stream(), torch.cuda.Stream(priority=-1)

    def serial() -> None:
        for w in weights:
            full_attention()
            gemms(x_full, inter_full, w)

    def serial_halves() -> None:
        for w in weights:
            for _ in range(2):
                half_attention()
                gemms(x_half, inter_half, w)

    def overlap(side: torch.cuda.Stream):
        def run() -> None:
            main = torch.cuda.current_stream()
            for w in weights:
                for _ in range(2):  # the halves swap roles; the shapes are the same
                    side.wait_stream(main)
                    with torch.cuda.stream(side):
                        half_attention()
                    gemms(x_half, inter_half, w)
                    main.wait_stream(side)

        return run

    def attention_alone() -> None:
        for _ in weights:
            full_attention()

    def gemms_alone() -> None:
        for w in weights:
            gemms(x_full, inter_full, w)

    return {
        "serial": serial,
        "serial halves": serial_halves,
        "overlap": overlap(side_low),
        "overlap, attn hi": overlap(side_high),
        "attention alone": attention_alone,
        "gemms alone": gemms_alone,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    for name in args.cases.split(","):
        num_seqs, context = CASES[name]
        for label, call in variants(num_seqs, context).items():
            rows.append(
                dict(case=name, variant=label, ms_per_layer=time_ms(call, iters=5) / LAYERS)
            )
            print(json.dumps(rows[-1]), flush=True)
        torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print(f"\n{'case':5} {'variant':18} {'ms/layer':>9}")
    for row in rows:
        print(f"{row['case']:5} {row['variant']:18} {row['ms_per_layer']:9.3f}")


if __name__ == "__main__":
    main()
