"""Beam search as vLLM's `LLM.beam_search` defines it, driven from outside the engine.

Each step runs every live beam of every prompt as a one-token request asking for the top
2 * beam_width logprobs; the prefix cache hands each beam the KV blocks of the sequence it
forked from (the full ones; the partial last block is recomputed), so forking costs no copy.
Candidates: every beam extended by each of its returned tokens, cum_logprob summed. A candidate
ending in EOS (unless ignore_eos) is complete; the others are ranked by score and the best
beam_width go on. At the end the complete and live beams are ranked together and the best
beam_width returned. score = cum_logprob / seq_len ** length_penalty, where seq_len counts the
prompt and the generated tokens, less a final EOS (vLLM's rule).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pagedlm.errors import InvalidRequest
from pagedlm.outputs import Logprob
from pagedlm.sampling_params import MAX_LOGPROBS, SamplingParams

if TYPE_CHECKING:
    from pagedlm.engine.llm_engine import PromptType
    from pagedlm.llm import LLM


@dataclass(frozen=True)
class BeamSearchParams:
    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0

    def __post_init__(self) -> None:
        max_width = MAX_LOGPROBS // 2
        if not 1 <= self.beam_width <= max_width:
            raise InvalidRequest(
                f"beam_width must be in [1, {max_width}] (each step asks for "
                f"2 * beam_width <= {MAX_LOGPROBS} logprobs), got "
                f"{self.beam_width}",
                param="beam_width",
            )
        if self.max_tokens < 1:
            raise InvalidRequest(
                f"max_tokens must be at least 1, got {self.max_tokens}", param="max_tokens"
            )
        if self.temperature < 0.0:
            raise InvalidRequest(
                f"temperature must be non-negative, got {self.temperature}", param="temperature"
            )


@dataclass
class BeamSearchSequence:
    tokens: list[int]  # the prompt's, then the generated ones
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)  # per generated token
    cum_logprob: float = 0.0
    text: str | None = None  # the decoded tokens (prompt included), filled at the end
    finish_reason: str | None = None  # stop (EOS) | length


@dataclass
class BeamSearchOutput:
    sequences: list[BeamSearchSequence]  # best first


def beam_search_score(
    tokens: Sequence[int], cum_logprob: float, eos_token_ids: Collection[int], length_penalty: float
) -> float:
    seq_len = len(tokens) - (1 if tokens[-1] in eos_token_ids else 0)
    return cum_logprob / seq_len**length_penalty


@dataclass
class _Instance:
    """One prompt's search: live beams, completed beams, and how many steps it may take."""

    beams: list[BeamSearchSequence]
    num_steps: int
    cache_salt: str | None  # the prompt's, on every step's requests
    completed: list[BeamSearchSequence] = field(default_factory=list)


def beam_search(
    llm: LLM, prompts: Sequence[PromptType], params: BeamSearchParams
) -> list[BeamSearchOutput]:
    engine = llm.llm_engine
    eos_token_ids = frozenset(() if params.ignore_eos else engine.model_config.eos_token_ids)
    instances = [_new_instance(llm, prompt, params) for prompt in prompts]
    step_params = SamplingParams(
        logprobs=2 * params.beam_width,
        max_tokens=1,
        temperature=params.temperature,
        ignore_eos=True,
    )
    for step in range(params.max_tokens):
        live = [inst for inst in instances if inst.beams and step < inst.num_steps]
        if not live:
            break
        step_prompts = [
            {"prompt_token_ids": beam.tokens, "cache_salt": inst.cache_salt}
            for inst in live
            for beam in inst.beams
        ]
        outputs = llm.generate(step_prompts, step_params, use_tqdm=False)
        results = iter(outputs)
        for inst in live:
            candidates = [
                _extend(beam, next(results).outputs[0].logprobs[0]) for beam in inst.beams
            ]
            _advance(inst, [c for group in candidates for c in group], eos_token_ids, params)
    return [_finish(llm, inst, eos_token_ids, params) for inst in instances]


def _new_instance(llm: LLM, prompt: PromptType, params: BeamSearchParams) -> _Instance:
    processed = llm.llm_engine.process_request(prompt, SamplingParams(max_tokens=params.max_tokens))
    if processed.prompt_embeds is not None:
        raise InvalidRequest(
            "prompts: beam search needs token ids or text, not prompt_embeds", param="prompt_embeds"
        )
    return _Instance(
        beams=[BeamSearchSequence(tokens=list(processed.prompt_token_ids))],
        num_steps=processed.max_tokens,
        cache_salt=processed.cache_salt,
    )


def _extend(beam: BeamSearchSequence, logprobs: dict[int, Logprob]) -> list[BeamSearchSequence]:
    return [
        BeamSearchSequence(
            tokens=beam.tokens + [token_id],
            logprobs=beam.logprobs + [logprobs],
            cum_logprob=beam.cum_logprob + logprob.logprob,
        )
        for token_id, logprob in logprobs.items()
    ]


def _advance(
    inst: _Instance,
    candidates: list[BeamSearchSequence],
    eos_token_ids: frozenset[int],
    params: BeamSearchParams,
) -> None:
    live = []
    for candidate in candidates:
        if candidate.tokens[-1] in eos_token_ids:
            candidate.finish_reason = "stop"
            inst.completed.append(candidate)
        else:
            live.append(candidate)
    inst.beams = _best(live, eos_token_ids, params)


def _best(
    beams: list[BeamSearchSequence], eos_token_ids: frozenset[int], params: BeamSearchParams
) -> list[BeamSearchSequence]:
    def score(beam: BeamSearchSequence) -> float:
        return beam_search_score(
            beam.tokens, beam.cum_logprob, eos_token_ids, params.length_penalty
        )

    return sorted(beams, key=score, reverse=True)[: params.beam_width]


def _finish(
    llm: LLM, inst: _Instance, eos_token_ids: frozenset[int], params: BeamSearchParams
) -> BeamSearchOutput:
    for beam in inst.beams:
        beam.finish_reason = "length"
    best = _best(inst.completed + inst.beams, eos_token_ids, params)
    tokenizer = llm.llm_engine.tokenizer
    if tokenizer is not None:
        for beam in best:
            beam.text = tokenizer.decode(beam.tokens)
    return BeamSearchOutput(sequences=best)
