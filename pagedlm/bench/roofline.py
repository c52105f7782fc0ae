"""The hardware limit of a workload, from the model's shape: bytes over bandwidth and FLOPs
over peak. Numbers measured on the H200 (shared/BENCHMARKS.md): 4.23 TB/s, 797 TFLOP/s bf16."""

from __future__ import annotations

from dataclasses import dataclass

from pagedlm.config import ModelConfig

BANDWIDTH_BYTES_S = 4.23e12
PEAK_FLOPS = 797e12


@dataclass(frozen=True)
class ModelCost:
    weight_bytes: int  # what a forward pass reads in full: the layers and the LM head (of an untied
    # embedding table only the tokens' rows, not counted)
    layer_flops_per_token: int  # 2 x the decoder layers' weights a token multiplies
    head_flops_per_row: int  # 2 x the LM head's weights, for each row of logits (a sampled token)
    kv_bytes_per_token: int  # K and V of one token over all layers
    attn_flops_per_pair: int  # FLOPs of one query token against one key, all layers

    @classmethod
    def of(cls, m: ModelConfig) -> ModelCost:
        q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
        per_layer = (
            m.hidden_size * (q + 2 * kv)
            + q * m.hidden_size
            + 3 * m.hidden_size * m.intermediate_size
        )
        head = m.vocab_size * m.hidden_size
        itemsize = m.dtype.itemsize
        return cls(
            weight_bytes=(m.num_layers * per_layer + head) * itemsize,
            layer_flops_per_token=2 * m.num_layers * per_layer,
            head_flops_per_row=2 * head,
            kv_bytes_per_token=2 * m.num_layers * kv * itemsize,
            attn_flops_per_pair=4 * m.num_layers * q,
        )


@dataclass(frozen=True)
class HardwareFloor:
    """A workload's time at the limits: its FLOPs at PEAK_FLOPS and its bytes at BANDWIDTH_BYTES_S."""

    compute_seconds: float
    memory_seconds: float

    @property
    def seconds(self) -> float:
        """The larger of the two: the time no engine can beat on this hardware."""
        return max(self.compute_seconds, self.memory_seconds)

    def results(self, elapsed: float) -> dict[str, float]:
        """The benchmarks' JSON fields for a run that took `elapsed` seconds."""
        return {
            "hardware_floor_seconds": self.seconds,
            "compute_floor_seconds": self.compute_seconds,
            "memory_floor_seconds": self.memory_seconds,
            "fraction_of_hardware_limit": self.seconds / elapsed,
        }

    def describe(self, elapsed: float) -> str:
        return (
            f"{100 * self.seconds / elapsed:.1f}% of the hardware limit (FLOPs at {PEAK_FLOPS / 1e12:.0f} "
            f"TFLOP/s: {self.compute_seconds * 1e3:.1f} ms; bytes at {BANDWIDTH_BYTES_S / 1e12:.2f} TB/s: "
            f"{self.memory_seconds * 1e3:.1f} ms)"
        )


def generation_floor(
    cost: ModelCost, prompt_lens: list[int], output_lens: list[int], max_batch: int
) -> HardwareFloor:
    """A lower bound on the wall time of generating `output_lens` tokens after `prompt_lens`:
    FLOPs at peak — the decoder layers and causal attention for every token the model runs (the
    prompt and every output but the last), the LM head for each output token's row only — and, for
    the decode steps, the weights read once per step and every sequence's KV read once per step, at
    full bandwidth. Requests run `max_batch` at a time, longest outputs together (the most
    favourable packing)."""
    flops = 0
    for p, o in zip(prompt_lens, output_lens, strict=True):
        forward = p + max(o, 1) - 1  # tokens through the layers; token i attends to i + 1 keys
        flops += (
            forward * cost.layer_flops_per_token
            + o * cost.head_flops_per_row
            + cost.attn_flops_per_pair * forward * (forward + 1) // 2
        )
    order = sorted(zip(output_lens, prompt_lens), reverse=True)
    bytes_moved = 0
    for start in range(0, len(order), max_batch):
        group = order[start : start + max_batch]
        steps = group[0][0]
        bytes_moved += steps * cost.weight_bytes
        for o, p in group:
            bytes_moved += cost.kv_bytes_per_token * (o * p + o * (o - 1) // 2)
    return HardwareFloor(flops / PEAK_FLOPS, bytes_moved / BANDWIDTH_BYTES_S)
