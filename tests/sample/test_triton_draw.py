"""The fused Triton draw (triton_draw.py) against the torch path (gumbel.py, noise.py): the same
noise bit for bit, the same block log-masses, the same ids, the right distribution. On the CPU the
kernels run in the Triton interpreter (tests/conftest.py), one program costing milliseconds: hence
few rows, except in the distribution check."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from pagedlm.sample import SamplingState, sampler
from pagedlm.sample.gumbel import block_size_for, gumbel_draw
from pagedlm.sample.noise import GOLDEN, gumbel_noise, mix64_, to_int64
from pagedlm.sample.triton_draw import fused_gumbel_draw, gumbel_noise_at, launch_draw, noise_hash
from pagedlm.sampling_params import SamplingParams

# An all-banned block's log-mass is log(0) = -inf by design; numpy (the interpreter) warns about it.
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
NEAR_TIE = 1e-4  # float64 score gap that float32 rounding may flip


@triton.jit
def noise_kernel(hash_ptr, gumbel_ptr, keys_ptr, WIDTH: tl.constexpr):
    """Row r: noise_hash and gumbel_noise_at of (keys[r], 0..WIDTH-1)."""
    row = tl.program_id(0)
    key = tl.load(keys_ptr + row)
    index = tl.arange(0, WIDTH)
    tl.store(hash_ptr + row * WIDTH + index, noise_hash(key, index).to(tl.int64, bitcast=True))
    tl.store(gumbel_ptr + row * WIDTH + index, gumbel_noise_at(key, index))


def sampled_ids(
    params: list[SamplingParams],
    logits: torch.Tensor,
    triton_device_types: tuple[str, ...] = ("cuda",),
) -> torch.Tensor:
    """[N]: one sampling step on the CPU of logits [N, V] (not modified), row r with params[r] (seed 3,
    prompt [1, 2], EOS 0); triton_device_types ("cuda", "cpu"): the Triton kernels in the interpreter."""
    num_rows, vocab_size = logits.shape
    state = SamplingState(
        num_rows, vocab_size, "cpu", seed=3, triton_device_types=triton_device_types
    )
    for row, p in enumerate(params):
        state.add_request(row, p, [1, 2], [], eos_token_ids=[0])
    return state.sample(logits.clone(), np.arange(num_rows, dtype=np.int32)).sampled_token_ids


def random_keys(num_rows: int, gen: torch.Generator, device: str = "cpu") -> torch.Tensor:
    """[num_rows] int64 over the whole range, negatives and both extremes included."""
    keys = torch.randint(INT64_MIN, INT64_MAX, (num_rows,), dtype=torch.int64, generator=gen)
    keys[:4] = torch.tensor([0, -1, INT64_MIN, INT64_MAX])
    return keys.to(device)


def check_noise(device: str, num_rows: int, width: int) -> None:
    keys = random_keys(num_rows, torch.Generator().manual_seed(1), device)
    hashes = torch.full((num_rows, width), -7, dtype=torch.int64, device=device)  # poisoned
    gumbels = torch.full((num_rows, width), float("nan"), device=device)
    noise_kernel[(num_rows,)](hashes, gumbels, keys, WIDTH=width)
    offsets = torch.arange(1, width + 1, dtype=torch.int64, device=device) * to_int64(GOLDEN)
    expected_hashes = mix64_(keys[:, None] + offsets)  # [N, width]
    assert torch.equal(hashes, expected_hashes)
    torch.testing.assert_close(gumbels, gumbel_noise(keys, width), rtol=1e-6, atol=1e-6)


def test_noise_hash_bit_exact_gumbel_within_an_ulp_or_two() -> None:
    check_noise("cpu", num_rows=6, width=64)


def torch_draw(
    logits: torch.Tensor, temperature: torch.Tensor | None, keys: torch.Tensor
) -> torch.Tensor:
    """The torch path of sampler.draw for rows without truncation."""
    scaled = logits - logits.amax(dim=-1, keepdim=True)
    if temperature is not None:
        scaled = scaled / temperature[:, None]
    return gumbel_draw(scaled.exp(), keys)


def reference_logmass(logits: torch.Tensor, temperature: torch.Tensor | None) -> torch.Tensor:
    """float64 logsumexp of each block of logits / T: [N, num_blocks]."""
    num_rows, vocab_size = logits.shape
    block_size = block_size_for(vocab_size)
    num_blocks = -(-vocab_size // block_size)
    x = logits.double() if temperature is None else logits.double() / temperature.double()[:, None]
    padded = torch.full(
        (num_rows, num_blocks * block_size),
        float("-inf"),
        dtype=torch.float64,
        device=logits.device,
    )
    padded[:, :vocab_size] = x
    return padded.reshape(num_rows, num_blocks, block_size).logsumexp(dim=-1)


def assert_near_optimal(
    ids: torch.Tensor, logits: torch.Tensor, temperature: torch.Tensor | None, keys: torch.Tensor
) -> None:
    """Each id wins both Gumbel-max stages of the float64 reference, up to a near-tie."""
    num_rows, vocab_size = logits.shape
    block_size = block_size_for(vocab_size)
    logmass = reference_logmass(logits, temperature)  # [N, num_blocks]
    num_blocks = logmass.shape[1]
    noise = gumbel_noise(keys, num_blocks + block_size).double()  # [N, num_blocks + B]
    block_scores = logmass + noise[:, :num_blocks]
    blocks = ids // block_size  # [N]
    gap1 = block_scores.amax(dim=-1) - block_scores.gather(1, blocks[:, None]).squeeze(1)
    members = blocks[:, None] * block_size + torch.arange(block_size, device=ids.device)  # [N, B]
    x = logits.double() if temperature is None else logits.double() / temperature.double()[:, None]
    scores = x.gather(1, members.clamp(max=vocab_size - 1)).masked_fill(
        members >= vocab_size, float("-inf")
    )
    scores += noise[:, num_blocks:]
    gap2 = scores.amax(dim=-1) - scores.gather(1, (ids - blocks * block_size)[:, None]).squeeze(1)
    assert ((ids >= 0) & (ids < vocab_size)).all()
    assert (gap1 <= NEAR_TIE).all() and (gap2 <= NEAR_TIE).all(), (gap1.max(), gap2.max())


def random_case(num_rows: int, vocab_size: int, seed: int, device: str = "cpu") -> torch.Tensor:
    """Logits [N, V] ~ 3 N(0, 1) with ~20% banned ids; row 1 bans whole blocks (the first two and
    the last, partial one), row 2 keeps a single id."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_rows, vocab_size, generator=gen) * 3
    logits.masked_fill_(torch.rand(num_rows, vocab_size, generator=gen) < 0.2, float("-inf"))
    block_size = block_size_for(vocab_size)
    logits[1, : 2 * block_size] = float("-inf")
    logits[1, (vocab_size - 1) // block_size * block_size :] = float("-inf")
    logits[2, :] = float("-inf")
    logits[2, vocab_size // 2] = 1.0
    return logits.to(device)


def temperatures(kind: str, num_rows: int, device: str) -> torch.Tensor | None:
    if kind == "none":
        return None
    values = torch.tensor([0.3, 0.7, 1.0, 2.5] * num_rows)[:num_rows]
    if kind == "column":  # a strided column, as SamplingState's [N, 6] float table gives it
        return torch.stack([values * 7, values], dim=1).to(device)[:, 1]
    return values.to(device)


def check_same_ids(num_rows: int, vocab_size: int, kind: str, seed: int, device: str) -> None:
    logits = random_case(num_rows, vocab_size, seed, device)
    temperature = temperatures(kind, num_rows, device)
    keys = random_keys(num_rows, torch.Generator().manual_seed(seed + 1), device)
    num_blocks = -(-vocab_size // block_size_for(vocab_size))
    logmass = torch.full((num_rows, num_blocks), float("nan"), device=device)  # poisoned
    ids = torch.full((num_rows,), -1, dtype=torch.int64, device=device)
    launch_draw(logits, temperature, keys, logmass, ids)
    torch.testing.assert_close(
        logmass.double(), reference_logmass(logits, temperature), rtol=1e-5, atol=1e-5
    )
    assert_near_optimal(ids, logits, temperature, keys)
    num_different = int((ids != torch_draw(logits, temperature, keys)).sum())
    assert num_different <= num_rows // 100, num_different
    assert torch.equal(fused_gumbel_draw(logits, temperature, keys), ids)  # the allocating wrapper


@pytest.mark.parametrize("vocab_size", [50, 64, 131, 300, 5000])  # 5000: two kernel-1 tiles a row
@pytest.mark.parametrize("kind", ["none", "tensor", "column"])
def test_same_ids_as_torch_path(vocab_size: int, kind: str) -> None:
    check_same_ids(num_rows=6, vocab_size=vocab_size, kind=kind, seed=vocab_size, device="cpu")


def test_all_banned_row_gives_an_id_in_range() -> None:
    logits = torch.full((2, 70), float("-inf"))
    logits[1, 69] = 0.0
    ids = fused_gumbel_draw(logits, torch.tensor([0.5, 0.5]), torch.tensor([3, -3]))
    assert 0 <= int(ids[0]) < 70 and int(ids[1]) == 69


def test_empty_batch() -> None:
    assert fused_gumbel_draw(torch.empty(0, 40), None, torch.empty(0, dtype=torch.int64)).shape == (
        0,
    )


@pytest.mark.parametrize(
    "bad, name",
    [
        (dict(logits=torch.zeros(3, 40, dtype=torch.float16)), "logits"),
        (dict(logits=torch.zeros(40, 3).t()), "stride"),
        (dict(keys=torch.zeros(2, dtype=torch.int64)), "keys"),
        (dict(keys=torch.zeros(3, dtype=torch.int32)), "keys"),
        (dict(temperature=torch.ones(3, dtype=torch.float64)), "temperature"),
        (dict(temperature=torch.ones(4)), "temperature"),
    ],
)
def test_bad_inputs_raise(bad: dict, name: str) -> None:
    args = dict(logits=torch.zeros(3, 40), temperature=None, keys=torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match=name):
        fused_gumbel_draw(**{**args, **bad})


# One row, V = 10 (B = 4: blocks [0, 4), [4, 8), [8, 10)), id 2 and 9 banned; T = 0.7.
DIST_LOGITS = [2.0, 0.0, float("-inf"), 0.5, -0.5, -0.5, -0.5, -0.5, 1.0, float("-inf")]
DIST_TEMPERATURE = 0.7


def dist_probs(temperature: float, block_uniform: bool = False) -> np.ndarray:
    """softmax(DIST_LOGITS / T); block_uniform: each block drawn with probability 1/3 instead of
    its mass (a wrong stage 1, for the negative check)."""
    probs = np.exp(np.array(DIST_LOGITS) / temperature)
    probs /= probs.sum()
    if block_uniform:
        for start in range(0, len(probs), 4):
            probs[start : start + 4] /= 3 * probs[start : start + 4].sum()
    return probs


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson's statistic over the ids of positive probability; inf if a banned id was drawn."""
    support = probs > 0.0
    if counts[~support].any():
        return float("inf")
    expected = counts.sum() * probs[support]
    return float(((counts[support] - expected) ** 2 / expected).sum())


CHI_SQUARE_BOUND = 29.9  # 7 degrees of freedom: the quantile at 1 - 1e-4


@pytest.mark.slow
def test_distribution_matches_softmax_over_temperature() -> None:
    """400 draws of one row (each a program in the interpreter, ~8 s): chi-square against the
    exact target passes, and the same counts reject a temperature of 1 and uniform block picks."""
    num_draws = 400
    logits = torch.tensor(DIST_LOGITS).expand(num_draws, -1).contiguous()
    keys = random_keys(num_draws, torch.Generator().manual_seed(5))
    ids = fused_gumbel_draw(logits, torch.full((num_draws,), DIST_TEMPERATURE), keys)
    counts = np.bincount(ids.numpy(), minlength=len(DIST_LOGITS))
    assert chi_square(counts, dist_probs(DIST_TEMPERATURE)) < CHI_SQUARE_BOUND
    assert chi_square(counts, dist_probs(1.0)) > CHI_SQUARE_BOUND
    assert chi_square(counts, dist_probs(DIST_TEMPERATURE, block_uniform=True)) > CHI_SQUARE_BOUND


def test_sampling_state_through_the_fused_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy, min_tokens and temperature rows through SamplingState: the fused path (forced on the
    CPU) draws what the torch path draws; a batch with top-p takes no fused draw."""
    vocab_size, num_rows = 90, 5
    logits = torch.randn(num_rows, vocab_size, generator=torch.Generator().manual_seed(11)) * 2
    plain = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.8, seed=1),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=1.9, seed=2),
        SamplingParams(temperature=0.6, min_tokens=3, stop_token_ids=[7]),
    ]
    top_p = [SamplingParams(temperature=0.8, seed=1, top_p=0.9)] * num_rows
    calls = []

    def counted_draw(*args: torch.Tensor | None) -> torch.Tensor:
        calls.append(args)
        return fused_gumbel_draw(*args)

    monkeypatch.setattr(sampler, "fused_gumbel_draw", counted_draw)
    for params, fusable in ((plain, True), (top_p, False)):
        sampled = []
        for device_types in (("cuda",), ("cuda", "cpu")):
            sampled.append(sampled_ids(params, logits, device_types))
        assert torch.equal(sampled[0], sampled[1])
        assert len(calls) == int(fusable)
        calls.clear()


@pytest.mark.gpu
def test_noise_on_cuda() -> None:
    check_noise("cuda", num_rows=64, width=1024)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["none", "column"])
def test_same_ids_on_cuda_at_full_vocab(kind: str) -> None:
    check_same_ids(num_rows=256, vocab_size=151936, kind=kind, seed=7, device="cuda")


@pytest.mark.gpu
def test_distribution_on_cuda() -> None:
    num_draws = 200_000
    logits = torch.tensor(DIST_LOGITS, device="cuda").expand(num_draws, -1).contiguous()
    keys = random_keys(num_draws, torch.Generator().manual_seed(6), "cuda")
    ids = fused_gumbel_draw(logits, torch.full((num_draws,), DIST_TEMPERATURE, device="cuda"), keys)
    counts = np.bincount(ids.cpu().numpy(), minlength=len(DIST_LOGITS))
    assert chi_square(counts, dist_probs(DIST_TEMPERATURE)) < CHI_SQUARE_BOUND


@pytest.mark.gpu
def test_draw_uses_the_fused_path_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """By default (no device types passed) a CUDA batch without min-p, top-k or top-p takes the
    fused draw; one with min-p does not."""
    calls: list[int] = []
    fused = sampler.fused_gumbel_draw

    def recording(*args, **kwargs):
        calls.append(1)
        return fused(*args, **kwargs)

    monkeypatch.setattr(sampler, "fused_gumbel_draw", recording)
    logits = torch.zeros(2, 40, device="cuda")
    params = sampler.RandomParams(noise_keys=torch.zeros(2, dtype=torch.int64, device="cuda"))
    sampler.draw(logits.clone(), params)
    assert calls == [1]
    params.min_p = torch.zeros(2, device="cuda")
    sampler.draw(logits.clone(), params)
    assert calls == [1]
