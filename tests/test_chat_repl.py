"""`pagedlm chat` and Ctrl-C: during a reply it stops the reply, not the chat (the reply so far stays
in the conversation); at the prompt, a Ctrl-C right after another one leaves. The REPL runs on the
main thread, where Python handles signals: the tests press Ctrl-C at chosen moments."""

from __future__ import annotations

import io
import signal
from pathlib import Path

import pytest

from pagedlm import LLM, SamplingParams
from pagedlm.chat_repl import LEAVE_HINT, STOPPED, run_chat_repl

LONG_REPLY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
CTRL_C = object()  # in a scripted stdin: Ctrl-C while the prompt waits


@pytest.fixture(scope="module")
def llm(tiny_llama_with_tokenizer_dir: Path) -> LLM:
    return LLM(
        str(tiny_llama_with_tokenizer_dir),
        dtype="float32",
        device="cpu",
        num_gpu_blocks_override=64,
        max_model_len=128,
    )


class CtrlCOnFirstWrite(io.StringIO):
    """A terminal whose user presses Ctrl-C as soon as the first reply starts to appear."""

    def __init__(self) -> None:
        super().__init__()
        self.pressed = False

    def write(self, text: str) -> int:
        written = super().write(text)
        if text and not self.pressed:
            self.pressed = True
            signal.raise_signal(signal.SIGINT)
        return written


class ScriptedStdin:
    """Lines typed at the prompt, or CTRL_C (readline then raises KeyboardInterrupt, as it does
    when SIGINT arrives while it waits)."""

    def __init__(self, *script: object) -> None:
        self.script = list(script)

    def isatty(self) -> bool:
        return False

    def readline(self) -> str:
        item = self.script.pop(0) if self.script else ""
        if item is CTRL_C:
            raise KeyboardInterrupt
        return item


def chat(llm: LLM, stdin: object, stdout: io.StringIO) -> None:
    """run_chat_repl; a KeyboardInterrupt that escapes it fails the test (not the whole run)."""
    try:
        run_chat_repl(llm, LONG_REPLY, stdin, stdout)
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C ended the chat")


def reply_to(llm: LLM, conversation: list[dict[str, str]]) -> str:
    return llm.chat(conversation, LONG_REPLY, use_tqdm=False)[0].outputs[0].text


def test_ctrl_c_stops_the_reply_and_the_chat_goes_on(llm: LLM) -> None:
    stdout = CtrlCOnFirstWrite()
    chat(llm, io.StringIO("hello world\nthe cat\n"), stdout)
    first_line, second_line, rest = stdout.getvalue().split("\n", 2)
    assert first_line.endswith(STOPPED) and rest == ""
    stopped = first_line.removesuffix(STOPPED)
    whole = reply_to(llm, [{"role": "user", "content": "hello world"}])
    assert stopped and whole.startswith(stopped) and len(stopped) < len(whole)
    assert second_line == reply_to(
        llm,
        [
            {"role": "user", "content": "hello world"},
            {"role": "assistant", "content": stopped},
            {"role": "user", "content": "the cat"},
        ],
    )
    assert not llm.llm_engine.has_unfinished_requests()  # the stopped request was aborted


def test_ctrl_c_twice_at_the_prompt_leaves(llm: LLM) -> None:
    stdin = ScriptedStdin("hello world\n", CTRL_C, "the cat\n", CTRL_C, CTRL_C, "not read\n")
    stdout = io.StringIO()
    chat(llm, stdin, stdout)
    lines = stdout.getvalue().split("\n")
    assert lines[2] == lines[5] == LEAVE_HINT  # after each reply, the first Ctrl-C: the hint
    assert lines[1] == lines[4] == "" and lines[6:] == ["", ""]  # the second Ctrl-C: a newline
    assert stdin.script == ["not read\n"]
