"""OpenAI's request and response bodies (plus vLLM's extras) as pydantic models.

Requests forbid unknown fields: a parameter the server does not implement is refused with 400
naming it, never silently ignored. Types are strict, as OpenAI's schema states them: an integer
or boolean field takes no string, float or boolean in its place (`"5"`, `true`), a float field
takes integers but no strings. Floats must be finite; strings must be valid Unicode (no lone
surrogates such as JSON's "\\ud800")."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from pagedlm.errors import InvalidRequest
from pagedlm.sampling_params import MAX_LOGPROBS, SamplingParams
from pagedlm.server.protocol_base import RequestBase
from pagedlm.server.protocol_tools import (
    ChatTool,
    DeltaToolCall,
    ResponseFormat,
    StructuredOutputsBody,
    ToolCall,
    ToolCallIn,
    ToolChoice,
)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_N = 128  # OpenAI's limit on choices per request
MAX_TEMPERATURE = 2.0  # OpenAI's
MAX_PROMPTS = 2048  # prompts in one completions request (a list of texts or of token-id lists)
# Every output token is checked against every stop string (the detokenizer), and a stream holds
# back the longest one's length in characters: both stay small.
MAX_STOPS = 16
MAX_STOP_CHARS = 256


def _string_or_list(value: Any) -> str | None:
    return "string" if isinstance(value, str) else "list" if isinstance(value, list) else None


def _prompt_shape(value: Any) -> str | None:
    """A list prompt by its first item: texts, token-id lists or (also when empty) token ids."""
    if not isinstance(value, list):
        return _string_or_list(value)
    first = value[0] if value else None
    return (
        "texts"
        if isinstance(first, str)
        else "token_id_lists"
        if isinstance(first, list)
        else "token_ids"
    )


def _by_shape(shape: Any, expected: str) -> Discriminator:
    """A union that picks its member by the value's JSON shape, so that an error is that
    member's alone (a smart union reports every member's, the first one unrelated)."""
    return Discriminator(
        shape, custom_error_type="wrong_shape", custom_error_message=f"must be {expected}"
    )


TokenIds = Annotated[list[int], Field(fail_fast=True)]  # fail fast: one error, not millions
Batch = Field(max_length=MAX_PROMPTS, fail_fast=True)
Prompt = Annotated[
    Annotated[str, Tag("string")]
    | Annotated[list[str], Batch, Tag("texts")]
    | Annotated[TokenIds, Tag("token_ids")]
    | Annotated[list[TokenIds], Batch, Tag("token_id_lists")],
    _by_shape(
        _prompt_shape,
        "a string, a list of strings, a list of token ids or a list of token-id lists",
    ),
]
StopString = Annotated[str, Field(max_length=MAX_STOP_CHARS)]
Stop = Annotated[
    Annotated[StopString, Tag("string")]
    | Annotated[list[StopString], Field(max_length=MAX_STOPS), Tag("list")],
    _by_shape(_string_or_list, "a string or a list of strings"),
]


class StreamOptions(RequestBase):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage in every chunk (with include_usage)


class SamplingFields(RequestBase):
    """What both generation endpoints accept: OpenAI's parameters and vLLM's extras."""

    model: str | None = None
    temperature: float | None = Field(None, ge=0.0, le=MAX_TEMPERATURE)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Stop | None = None
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX - MAX_N)  # sample i uses seed + i
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # vLLM's extras
    top_k: int | None = Field(None, ge=-1, le=INT64_MAX)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0, le=INT64_MAX)
    stop_token_ids: TokenIds | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    priority: int = Field(0, ge=INT64_MIN, le=INT64_MAX)
    request_id: str | None = None
    cache_salt: str | None = None  # non-empty (the engine checks): isolates prefix-cache entries
    structured_outputs: StructuredOutputsBody | None = None
    response_format: ResponseFormat | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """Usage in every chunk: vLLM's continuous_usage_stats, which needs include_usage."""
        return self.include_usage and self.stream_options.continuous_usage_stats

    def to_sampling_params(
        self,
        max_tokens: int,
        logprobs: int | None,
        vocab_size: int,
        structured_outputs: dict[str, Any] | None = None,
    ) -> SamplingParams:
        """Raises InvalidRequest naming the parameter when a value is out of range."""
        top_k = self.top_k or 0
        return SamplingParams(
            n=self.n,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=0 if top_k >= vocab_size else top_k,  # a k that keeps the whole vocab is off
            min_p=self.min_p or 0.0,
            seed=self.seed,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            logit_bias=_logit_bias(self.logit_bias),
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            stop=self.stop,
            stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos,
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens,
            logprobs=logprobs,
            structured_outputs=structured_outputs,
        )


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    if bias is None:
        return None
    try:
        parsed = {int(token): value for token, value in bias.items()}
    except ValueError:
        raise InvalidRequest(
            "logit_bias keys must be token ids (integers as strings)", param="logit_bias"
        ) from None
    bad = [v for v in parsed.values() if not -100.0 <= v <= 100.0]
    if bad:
        raise InvalidRequest(
            f"logit_bias values must be in [-100, 100], got {bad[0]}", param="logit_bias"
        )
    return parsed


class CompletionRequest(SamplingFields):
    prompt: Prompt
    suffix: str | None = None
    max_tokens: int | None = Field(16, ge=1, le=INT64_MAX)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)


class TextPart(RequestBase):
    type: Literal["text"]
    text: str


Content = Annotated[
    Annotated[str, Tag("string")] | Annotated[list[TextPart], Tag("list")],
    _by_shape(_string_or_list, "a string or a list of text parts"),
]


class ChatMessage(RequestBase):
    # developer: OpenAI's newer system; tool: a tool's result (tool_call_id names the call)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Content | None = Field(None, validate_default=True)
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[ToolCallIn] | None = None  # an assistant's, earlier in the conversation

    @field_validator("content")
    @classmethod
    def _content_unless_assistant(
        cls, content: Content | None, info: ValidationInfo
    ) -> Content | None:
        """OpenAI: only an assistant message (one with tool calls) may leave its content out."""
        role = info.data.get("role")
        if content is None and role not in (None, "assistant"):
            raise PydanticCustomError(
                "missing",
                "a {role} message needs content: a string or a list of text parts",
                {"role": role},
            )
        return content

    @model_validator(mode="after")
    def _tool_fields_by_role(self) -> ChatMessage:
        if self.role == "tool" and self.tool_call_id is None:
            raise PydanticCustomError("missing", "a tool message needs tool_call_id")
        if self.tool_calls is not None and self.role != "assistant":
            raise PydanticCustomError("not_assistant", "only an assistant message has tool_calls")
        return self

    def text(self) -> str:
        """The content; text parts joined by newlines, as vLLM joins them."""
        if isinstance(self.content, list):
            return "\n".join(part.text for part in self.content)
        return self.content or ""

    def template_role(self) -> str:
        """The role the chat template sees: templates know system, not developer."""
        return "system" if self.role == "developer" else self.role


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=INT64_MAX)
    max_completion_tokens: int | None = Field(None, ge=1, le=INT64_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[ChatTool] | None = None
    tool_choice: ToolChoice | None = None  # default: "auto" with tools, else "none" (OpenAI's)
    parallel_tool_calls: bool = True


class TokenizeRequest(RequestBase):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[ChatTool] | None = None  # with messages: what the chat template gets
    add_special_tokens: bool = True


class DetokenizeRequest(RequestBase):
    model: str | None = None
    tokens: TokenIds


# ---- responses --------------------------------------------------------------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None


class ResponseMetrics(BaseModel):
    """The response's top-level `metrics` (vLLM's): a single choice's speculative decoding."""

    speculative_decoding: dict[str, Any]


class _WithMetrics(BaseModel):
    """A response or chunk that carries `metrics` only where it has them."""

    metrics: ResponseMetrics | None = None

    @model_serializer(mode="wrap")
    def _metrics_only_when_set(self, handler: Any) -> dict[str, Any]:
        out = handler(self)
        if out.get("metrics") is None:
            out.pop("metrics", None)
        return out


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionResponse(_WithMetrics):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatChoiceLogprobs(BaseModel):
    content: list[ChatLogprob] | None = None


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    reasoning_content: str | None = None  # --reasoning-parser's think block (vLLM 0.x's name)


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(_WithMetrics):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo | None = None


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None

    @model_serializer(mode="wrap")
    def _only_what_changed(self, handler: Any) -> dict[str, Any]:
        """A delta names only what it brings, as OpenAI's do (the final one may be {})."""
        return {key: value for key, value in handler(self).items() if value is not None}


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionChunk(_WithMetrics):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "pagedlm"
    root: str
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str
