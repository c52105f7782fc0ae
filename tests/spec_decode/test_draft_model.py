"""The draft_model proposer on the CPU in float32: its k drafts against k greedy steps of
transformers on the same draft model, over ragged steps (a whole prompt, a prefill chunk that
does not sample, verified drafts with some rejected); its KV addressed with the target's block
table, NaN-poisoned so that a read of a slot nobody wrote shows."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tiny_hf_models import hf_greedy, random_prompts, save_tiny_model

from pagedlm.attention.backend import AttentionMetadata
from pagedlm.config import EngineArgs
from pagedlm.sample.noise import row_keys_np
from pagedlm.sample.sampler import RandomParams
from pagedlm.spec_decode.draft_config import draft_scratch_blocks
from pagedlm.spec_decode.draft_inputs import slot_mapping
from pagedlm.spec_decode.draft_model import DraftModelProposer, ModelVerifiedStep, draw_drafts
from pagedlm.spec_decode.proposer import VerifiedStep
from pagedlm.worker.memory import (
    determine_num_blocks,
    draft_scratch_bytes,
    kv_cache_bytes_per_block,
    pool_bytes_per_block,
)

K = 3
BLOCK_SIZE = 8
MAX_MODEL_LEN = 64
NUM_COLS = MAX_MODEL_LEN // BLOCK_SIZE


def spec_args(target, draft, **spec) -> EngineArgs:
    config = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": K, **spec}
    return EngineArgs(
        model=str(target),
        dtype="float32",
        device="cpu",
        max_model_len=MAX_MODEL_LEN,
        block_size=BLOCK_SIZE,
        num_gpu_blocks_override=64,
        skip_tokenizer_init=True,
        speculative_config=config,
    )


@pytest.fixture
def proposer(models):
    """Fresh per test (the token table and the cache start empty), NaN-poisoned KV."""
    target, draft, *_ = models
    proposer = DraftModelProposer(spec_args(target, draft).create_engine_config())
    proposer.load_model()
    proposer.allocate_kv_cache(64)
    for cache in proposer.kv_caches:
        cache.fill_(float("nan"))
    return proposer


@dataclass
class Chunk:
    """One request's part of a target step: inputs, its last num_drafts of them drafts."""

    row: int  # its persistent row, and its row of the block table
    token_ids: list[int]
    num_computed: int
    next_token: int | None = None  # the verifier's own token; None: does not sample
    num_drafts: int = 0
    num_rejected: int = 0

    @property
    def emitted(self) -> list[int]:
        """The accepted drafts, then the next token."""
        first = len(self.token_ids) - self.num_drafts
        accepted = self.num_drafts - self.num_rejected
        return self.token_ids[first : first + accepted] + [self.next_token]


def target_slots(chunks: list[Chunk], block_table: torch.Tensor) -> torch.Tensor:
    slots = []
    for chunk in chunks:
        for pos in range(chunk.num_computed, chunk.num_computed + len(chunk.token_ids)):
            block = int(block_table[chunk.row, pos // BLOCK_SIZE])
            slots.append(block * BLOCK_SIZE + pos % BLOCK_SIZE)
    return torch.tensor(slots, dtype=torch.int64)


def verified_step(chunks: list[Chunk], block_table: torch.Tensor) -> ModelVerifiedStep:
    starts, seq_lens = [0], []
    for chunk in chunks:
        starts.append(starts[-1] + len(chunk.token_ids))
        seq_lens.append(chunk.num_computed + len(chunk.token_ids))
    qsl = torch.tensor(starts, dtype=torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    meta = AttentionMetadata(
        num_tokens=starts[-1],
        num_seqs=len(chunks),
        max_query_len=max(len(c.token_ids) for c in chunks),
        max_seq_len=max(seq_lens),
        query_start_loc=qsl.clone(),
        seq_lens=lens.clone(),
        slot_mapping=target_slots(chunks, block_table),  # the draft computes its own
        block_table=block_table[[c.row for c in chunks]],
        query_start_loc_cpu=qsl,
        seq_lens_cpu=lens,
    )
    sampling = [i for i, c in enumerate(chunks) if c.next_token is not None]
    emitted = torch.full((len(sampling), K + 1), -1, dtype=torch.int64)
    for i, seq in enumerate(sampling):
        emitted[i, : len(chunks[seq].emitted)] = torch.tensor(chunks[seq].emitted)
    rows = np.array([chunks[i].row for i in sampling], dtype=np.int64)
    first = np.array([seq_lens[i] - chunks[i].num_drafts for i in sampling], dtype=np.int64)
    return ModelVerifiedStep(
        rows_np=rows,
        rows=torch.from_numpy(rows),
        token_ids=emitted,
        num_accepted=torch.tensor([len(chunks[i].emitted) - 1 for i in sampling]).long(),
        first_positions_np=first,
        first_positions=torch.from_numpy(first),
        hidden_states=torch.zeros(1, 1),
        batch_index_np=np.array(sampling, dtype=np.int64),
        layout=None,
        inputs=None,
        attn_metadata=meta,
        # a sampling request's inputs as the ids table holds them after sampling: its first
        # (a placeholder) overwritten; the draft must read them from its own token table
        input_ids=torch.tensor(
            [0 if c.next_token is not None else t for c in chunks for t in c.token_ids]
        ),
    )


def test_drafts_equal_transformers_greedy_over_ragged_steps(models, proposer):
    hf_draft = models[2]
    block_table = torch.randperm(64, generator=torch.Generator().manual_seed(0))[1:]
    block_table = block_table[: 3 * NUM_COLS].view(3, NUM_COLS).to(torch.int32)  # no null block
    p0, p1, p2 = random_prompts(3, 6, 20, seed=3)
    for row, prompt in enumerate((p0, p1, p2)):
        proposer.add_request(row, prompt)
    n0, n2, y0, z1, w2, u0 = 5, 9, 17, 33, 41, 58
    cut = 12
    steps = [
        # a whole prompt; a prefill chunk that does not sample; another whole prompt
        (
            [Chunk(0, p0, 0, n0), Chunk(1, p1[:cut], 0), Chunk(2, p2, 0, n2)],
            [p0 + [n0], p2 + [n2]],
        ),
        # 3 drafts, 2 rejected; the chunk's end; 3 drafts, all accepted
        (
            [
                Chunk(0, [n0, 70, 71, 72], len(p0), y0, num_drafts=3, num_rejected=2),
                Chunk(1, p1[cut:], cut, z1),
                Chunk(2, [n2, 80, 81, 82], len(p2), w2, num_drafts=3),
            ],
            [p0 + [n0, 70, y0], p1 + [z1], p2 + [n2, 80, 81, 82, w2]],
        ),
        # all 3 rejected, over the KV that the rejected tail left
        (
            [Chunk(0, [y0, 90, 91, 92], len(p0) + 2, u0, num_drafts=3, num_rejected=3)],
            [p0 + [n0, 70, y0, u0]],
        ),
    ]
    for i, (chunks, expected) in enumerate(steps):
        drafts = proposer.propose(verified_step(chunks, block_table))
        assert drafts.probs is None and drafts.num_drafts.tolist() == [K] * len(expected)
        assert drafts.token_ids.tolist() == hf_greedy(hf_draft, expected, K), f"step {i}"


def test_a_step_without_sampling_requests_only_fills_the_draft_cache(proposer):
    block_table = torch.arange(1, 1 + NUM_COLS, dtype=torch.int32)[None, :]
    proposer.add_request(0, [3, 4, 5, 6])
    drafts = proposer.propose(verified_step([Chunk(0, [3, 4, 5], 0)], block_table))
    assert drafts.token_ids.shape == (0, K) and drafts.num_drafts.shape == (0,)
    block = proposer.kv_caches[0][:, 1]  # [2, block_size, Hkv, D]: block 1
    assert not block[:, :3].isnan().any() and block[:, 3:].isnan().all()


def greedy_verify(target, caches, chunks: list[Chunk], block_table: torch.Tensor) -> None:
    """One target step over the chunks: each request's drafts accepted while they are the
    target's argmax, next_token and num_rejected set as the rejection sampler's greedy path."""
    step = verified_step([replace(c, next_token=0) for c in chunks], block_table)
    meta = step.attn_metadata
    ids = torch.tensor([t for c in chunks for t in c.token_ids])
    positions = torch.cat(
        [torch.arange(c.num_computed, c.num_computed + len(c.token_ids)) for c in chunks]
    )
    argmax = target.compute_logits(target(ids, positions, caches, meta)).argmax(-1).tolist()
    end = 0
    for chunk in chunks:
        end += len(chunk.token_ids)
        first = end - chunk.num_drafts - 1  # the row that predicts the first draft
        drafts = chunk.token_ids[len(chunk.token_ids) - chunk.num_drafts :]
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == argmax[first + accepted]:
            accepted += 1
        chunk.next_token = argmax[first + accepted]
        chunk.num_rejected = chunk.num_drafts - accepted


def speculate(proposer, target, prompts: list[list[int]], num_tokens: int):
    """Greedy speculative decoding of the prompts with the proposer's drafts, verified by the
    target model (pagedlm's, its own paged cache): (outputs, accepted drafts per step)."""
    caches = [
        torch.full(
            (2, 64, BLOCK_SIZE, target.config.num_kv_heads, target.config.head_dim), float("nan")
        )
        for _ in range(target.config.num_layers)
    ]
    block_table = torch.arange(1, 1 + len(prompts) * NUM_COLS, dtype=torch.int32).view(-1, NUM_COLS)
    for row, prompt in enumerate(prompts):
        proposer.add_request(row, prompt)
    chunks = [Chunk(row, prompt, 0) for row, prompt in enumerate(prompts)]
    outputs, accepted = [[] for _ in prompts], []
    while min(len(out) for out in outputs) < num_tokens:
        greedy_verify(target, caches, chunks, block_table)
        drafts = proposer.propose(verified_step(chunks, block_table)).token_ids.tolist()
        accepted.append([c.num_drafts - c.num_rejected for c in chunks])
        for out, chunk in zip(outputs, chunks):
            out += chunk.emitted
        chunks = [
            Chunk(
                c.row,
                [c.next_token] + d,
                c.num_computed + len(c.token_ids) - c.num_drafts + len(c.emitted) - 1,
                num_drafts=K,
            )
            for c, d in zip(chunks, drafts)
        ]
    return [out[:num_tokens] for out in outputs], accepted


def self_draft(models) -> DraftModelProposer:
    """The target as its own draft: its model serves as the verifier too."""
    target = models[0]
    proposer = DraftModelProposer(spec_args(target, target).create_engine_config())
    proposer.load_model()
    proposer.allocate_kv_cache(64)
    return proposer


def test_a_draft_equal_to_the_target_accepts_every_greedy_draft(models):
    proposer = self_draft(models)
    prompts = random_prompts(3, 5, 13, seed=4)
    outputs, accepted = speculate(proposer, proposer.model, prompts, 12)
    assert outputs == hf_greedy(models[3], prompts, 12)
    assert accepted[0] == [0, 0, 0] and all(a == [K] * 3 for a in accepted[1:])


def test_greedy_outputs_with_another_draft_are_the_targets(models, proposer):
    prompts = random_prompts(3, 5, 13, seed=5)
    outputs, accepted = speculate(proposer, self_draft(models).model, prompts, 12)
    assert outputs == hf_greedy(models[3], prompts, 12)
    assert any(a < K for step in accepted[1:] for a in step)  # some drafts were refused


def test_slots_without_a_block_are_not_written():
    table = torch.tensor([[4, 0, 0], [6, 7, 2]], dtype=torch.int32)  # 0: the null block
    held = torch.tensor([3, 2])  # request 1's third column: a block it gave back
    seq = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    positions = torch.tensor([3, 8, 30, 9, 17, 24, 15])  # 24: past the columns
    slots = slot_mapping(table, held, seq, positions, block_size=8, max_model_len=32)
    assert slots.tolist() == [35, -1, -1, 57, -1, -1, 63]
    slots = slot_mapping(table, held + 1, seq, positions, block_size=8, max_model_len=16)
    assert slots.tolist() == [35, -1, -1, 57, -1, -1, 63]  # 17: past max_model_len


def test_the_pool_counts_target_and_draft_bytes(models):
    """A block costs both models' KV; the draft's scratch blocks (cdiv(k, block_size) for each
    request of the largest batch that drafts) are a fixed cost besides."""
    target, draft, *_ = models
    config = replace(
        spec_args(target, draft), num_gpu_blocks_override=None, kv_cache_memory_gib=0.01
    ).create_engine_config()
    target_bytes = kv_cache_bytes_per_block(config.model, BLOCK_SIZE)
    draft_bytes = kv_cache_bytes_per_block(config.draft_model, BLOCK_SIZE)
    assert pool_bytes_per_block(config) == target_bytes + draft_bytes
    assert config.draft_model.head_dim == 16 and config.model.head_dim == 16
    assert draft_scratch_blocks(config) == 64 * -(-K // BLOCK_SIZE)  # drafts up to batch 64
    scratch = draft_scratch_bytes(config)
    assert scratch == 64 * -(-K // BLOCK_SIZE) * draft_bytes
    num_blocks = determine_num_blocks(config, lambda: 0, 0)
    assert num_blocks == (int(0.01 * (1 << 30)) - scratch) // (target_bytes + draft_bytes)
    plain = EngineArgs(
        model=str(target), dtype="float32", device="cpu", block_size=BLOCK_SIZE,
        skip_tokenizer_init=True,
    )  # fmt: skip
    plain_config = plain.create_engine_config()
    assert pool_bytes_per_block(plain_config) == target_bytes
    assert draft_scratch_bytes(plain_config) == 0


def test_a_draft_with_other_special_ids_is_refused(models, tmp_path):
    target, *_ = models
    other = tmp_path / "other_eos"
    save_tiny_model(other, "llama", config_overrides={"eos_token_id": 7})
    with pytest.raises(ValueError, match=r"speculative_config\.model: special token eos"):
        spec_args(target, other).create_engine_config()


def test_a_draft_that_is_the_target_passes(models):
    target, *_ = models
    config = spec_args(target, target).create_engine_config()
    assert config.draft_model.model == config.model.model


def test_probabilistic_drafts_follow_q_with_salted_noise():
    """Draws from q = softmax(logits / T), independent of the verifier's noise; greedy rows
    take the argmax."""
    num_rows, vocab = 20_000, 6
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, 3.0]]).repeat(num_rows, 1)
    keys = torch.from_numpy(row_keys_np(np.arange(num_rows, dtype=np.uint64), np.zeros(num_rows)))
    temperature = torch.full((num_rows,), 2.0)
    is_greedy = torch.zeros(num_rows, dtype=torch.bool)
    is_greedy[:10] = True
    params = RandomParams(noise_keys=keys, is_greedy=is_greedy, temperature=temperature)
    drafts, q = draw_drafts(logits.clone(), params, 0, probabilistic=True)
    expected = torch.softmax(logits[0] / 2.0, dim=-1)
    torch.testing.assert_close(q[0], expected)
    assert (drafts[:10] == 5).all()
    freq = torch.bincount(drafts[10:], minlength=vocab).double() / (num_rows - 10)
    assert (freq - expected.double()).abs().sum() / 2 < 0.02  # total variation
    again, _ = draw_drafts(logits.clone(), params, 0, probabilistic=True)
    other_position, _ = draw_drafts(logits.clone(), params, 1, probabilistic=True)
    assert torch.equal(again, drafts)  # counter-based: the same keys draw the same
    assert (other_position != drafts).float().mean() > 0.3  # each draft position its own noise
    greedy, none = draw_drafts(logits.clone(), params, 0, probabilistic=False)
    assert none is None and (greedy == 5).all()


def test_a_verified_step_extends_to_a_model_verified_step():
    step = verified_step([Chunk(0, [3, 4], 0, 7)], torch.arange(1, 1 + NUM_COLS)[None, :])
    plain = VerifiedStep(**{f.name: getattr(step, f.name) for f in fields(VerifiedStep)})
    inputs = SimpleNamespace(prefix=lambda name, n: {"input_ids": step.input_ids}[name][:n])
    layout = SimpleNamespace(num_tokens=2, num_placeholders=0)
    extended = ModelVerifiedStep.of(
        replace(plain, inputs=inputs, layout=layout), step.attn_metadata
    )
    assert torch.equal(extended.input_ids, step.input_ids)
    assert extended.attn_metadata is step.attn_metadata and extended.rows is step.rows


def test_a_prefix_hit_reads_the_draft_kv_of_the_shared_blocks(models, proposer):
    """Request 1's table starts with request 0's first two blocks (a prefix-cache hit): its
    first step computes only its own tail, and drafts as if it had computed it all."""
    prompt = random_prompts(1, 20, 20, seed=6)[0]
    own = random_prompts(1, 5, 5, seed=7)[0]
    block_table = torch.tensor(
        [[3, 4, 5, 6, 7, 8, 9, 10], [3, 4, 11, 12, 13, 14, 15, 16]], dtype=torch.int32
    )
    shared = prompt[: 2 * BLOCK_SIZE]
    proposer.add_request(0, prompt)
    proposer.add_request(1, shared + own)
    proposer.propose(verified_step([Chunk(0, prompt, 0, 21)], block_table))
    drafts = proposer.propose(verified_step([Chunk(1, own, len(shared), 22)], block_table))
    assert drafts.token_ids.tolist() == hf_greedy(models[2], [shared + own + [22]], K)


def test_a_draft_whose_tokenizer_numbers_special_tokens_otherwise_is_refused(tmp_path):
    """Same sizes and config ids, but the draft's tokenizer has </s> and <unk> swapped."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    folders = {}
    for name, specials in (
        ("target", ["<unk>", "<s>", "</s>"]),
        ("draft", ["</s>", "<s>", "<unk>"]),
    ):
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        tokenizer.train_from_iterator(["hello world"] * 4, trainer)
        wrapped = PreTrainedTokenizerFast(
            tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
        )
        folders[name] = tmp_path / name
        save_tiny_model(folders[name], "llama", vocab_size=len(wrapped))
        wrapped.save_pretrained(folders[name])
    args = replace(spec_args(folders["target"], folders["draft"]), skip_tokenizer_init=False)
    with pytest.raises(ValueError, match=r"speculative_config\.model: special token (</s>|<unk>)"):
        args.create_engine_config()
    replace(args, speculative_config=None).create_engine_config()  # the target alone loads


def test_a_batch_size_that_decodes_plainly_drafts_nothing_but_keeps_the_kv(models):
    """k = 0 (the worker's k for a batch size that decodes plainly): no drafts for the pair,
    but the draft's KV of their tokens is written, so a later step of one of them alone drafts
    as transformers does; at k = 2 < num_speculative_tokens, 2 drafts (2 draft forwards)."""
    target, draft, hf_draft, _ = models
    args = spec_args(target, draft)
    proposer = DraftModelProposer(args.create_engine_config())
    proposer.load_model()
    proposer.allocate_kv_cache(64)
    block_table = torch.arange(1, 1 + 2 * NUM_COLS, dtype=torch.int32).view(2, NUM_COLS)
    p0, p1 = random_prompts(2, 6, 11, seed=8)
    proposer.add_request(0, p0)
    proposer.add_request(1, p1)
    pair = proposer.propose(verified_step([Chunk(0, p0, 0, 5), Chunk(1, p1, 0, 6)], block_table), 0)
    assert pair.num_drafts.tolist() == [0, 0] and (pair.token_ids == -1).all()
    alone = proposer.propose(verified_step([Chunk(0, [5], len(p0), 7)], block_table))
    assert alone.token_ids.tolist() == hf_greedy(hf_draft, [p0 + [5, 7]], K)
    two = proposer.propose(verified_step([Chunk(1, [6], len(p1), 9)], block_table), 2)
    assert two.num_drafts.tolist() == [2] and two.token_ids.shape == (1, K)
    assert two.token_ids[:, :2].tolist() == hf_greedy(hf_draft, [p1 + [6, 9]], 2)
    assert (two.token_ids[:, 2:] == -1).all()
