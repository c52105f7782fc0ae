"""Incremental detokenisation of one request's output, with stop-string checks.

`tokenizers.decoders.DecodeStream` turns one token at a time into text: it holds back text
that ends in an incomplete UTF-8 sequence (U+FFFD) until the bytes are complete, and decodes
each token in the context of the ones before, so SentencePiece word-start markers become
spaces in the middle of a text. The stream is primed with the end of the prompt, so the first
output token is decoded in context too.
"""

from __future__ import annotations

from tokenizers.decoders import DecodeStream

from pagedlm.engine.tokenizer import Tokenizer
from pagedlm.sampling_params import SamplingParams

_MIN_PRIME_TOKENS = 4
_MAX_PRIME_TOKENS = 24
# tokenizers' DecodeStream raises this when a byte-fallback decoder rewrites text it emitted
_INVALID_PREFIX = "Invalid prefix encountered"


class IncrementalDetokenizer:
    """Feed output tokens with `push`; read the text with `output_text`."""

    def __init__(
        self, tokenizer: Tokenizer, prompt_token_ids: list[int], params: SamplingParams
    ) -> None:
        self._tokenizer = tokenizer
        self._backend = tokenizer.backend_tokenizer
        self._skip_special_tokens = params.skip_special_tokens
        self._stream = DecodeStream(skip_special_tokens=self._skip_special_tokens)
        self._stops: list[str] = list(params.stop or [])
        self._include_stop = params.include_stop_str_in_output
        self._min_tokens = params.min_tokens
        # Streamed text stays this many characters behind, so a stop string that is still
        # arriving is never shown and then taken back.
        self._num_held_chars = (
            0 if self._include_stop or not self._stops else (max(len(s) for s in self._stops) - 1)
        )
        self._num_tokens = 0
        self._text = ""
        self._prime(prompt_token_ids)

    def _prime(self, prompt_token_ids: list[int]) -> None:
        """Step through a prompt suffix that decodes cleanly (starts on a character boundary)."""
        suffix = prompt_token_ids[-_MIN_PRIME_TOKENS:]
        for num in range(_MIN_PRIME_TOKENS, min(len(prompt_token_ids), _MAX_PRIME_TOKENS) + 1):
            candidate = prompt_token_ids[-num:]
            if "\ufffd" not in self._tokenizer.decode(candidate):
                suffix = candidate
                break
        for token_id in suffix:
            self._step(token_id)

    def push(self, token_id: int, ends_request: bool = False) -> str | None:
        """Append one output token; returns the stop string it completed, if any. After a
        stop the text is cut at the stop string (kept when include_stop_str_in_output).
        ends_request: the core stopped at this token (EOS or a stop token id); its text is
        left out unless include_stop_str_in_output (vLLM)."""
        self._num_tokens += 1
        if ends_request and not self._include_stop:
            return None
        delta = self._step(token_id)
        if not delta:
            return None
        self._text += delta
        if not self._stops or self._num_tokens <= self._min_tokens:
            return None
        return self._find_stop(len(delta))

    def _step(self, token_id: int) -> str | None:
        """The stream's new text; a stream whose text a byte-fallback decoder rewrote starts
        again at this token (as vLLM does)."""
        try:
            return self._stream.step(self._backend, token_id)
        except Exception as exc:  # tokenizers raises a bare Exception
            if not str(exc).startswith(_INVALID_PREFIX):
                raise
            self._stream = DecodeStream(skip_special_tokens=self._skip_special_tokens)
            return self._stream.step(self._backend, token_id)

    def _find_stop(self, num_new_chars: int) -> str | None:
        """Search only the new text plus the overlap a stop string could straddle."""
        found: tuple[int, str] | None = None
        for stop in self._stops:
            start = max(0, len(self._text) - num_new_chars - len(stop) + 1)
            index = self._text.find(stop, start)
            if index != -1 and (found is None or index < found[0]):
                found = (index, stop)
        if found is None:
            return None
        index, stop = found
        self._text = self._text[: index + len(stop) if self._include_stop else index]
        return stop

    def output_text(self, finished: bool) -> str:
        if finished or not self._num_held_chars:
            return self._text
        return self._text[: max(0, len(self._text) - self._num_held_chars)]
