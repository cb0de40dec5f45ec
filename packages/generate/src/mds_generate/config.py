"""What `mds-generate` runs, as frozen dataclasses checked on construction (errors name the flag).

`ModelSource` says where the weights and the vocabulary come from and how they run,
`SamplingConfig` how a next token is picked (Megatron's `generate_samples_gpt.py` filters plus
repetition and frequency penalties), `GenerationConfig` when a completion ends, and
`SampleConfig` / `EvalConfig` are the two commands' whole configurations.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from mds_checkpoint import CheckedShapeFlags, LoadFlags
from mds_common.flags import flag, restate
from mds_model.flags import HalfFlags
from mds_tokenize.flags import TokenizerFlags, named_tokenizer_spec, tokenizer_spec
from mds_tokenize.interface import TOKENIZER_TYPES, TokenizerSpec

DTYPES = ("auto", "float32", "bfloat16", "float16")
MODES = ("prompt", "input-file", "unconditional", "interactive")
TASKS = ("wikitext103", "lambada")


@dataclass(frozen=True)
class ModelSource:
    """An mds or upstream checkpoint (`--load` folder with `latest`, or one `global_stepN`) or a
    Hugging Face GPT-2, Llama, GPT-NeoX or BLOOM folder. The tokenizer defaults to the
    checkpoint's (meta.json's `tokenizer`, or the folder's tokenizer.json / vocab.json +
    merges.txt); `tokenizer_type` alone only checks it."""

    load: Path
    iteration: int | None = None
    tokenizer: TokenizerSpec | None = None  # None: the checkpoint's
    tokenizer_type: str | None = None
    device: str = "auto"  # auto: cuda when available
    dtype: str = "auto"  # auto: the checkpoint's on a GPU, float32 on CPU
    cuda_graphs: bool = True
    # Megatron model flags given on the command line, (GPTConfig field, value): checked against
    # the checkpoint, which says its own shape.
    expected_shape: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if self.iteration is not None and self.iteration < 0:
            raise ValueError(f"--iteration must be >= 0, got {self.iteration}")
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}; got {self.dtype!r}")
        if self.tokenizer_type is not None and self.tokenizer_type not in TOKENIZER_TYPES:
            raise ValueError(
                f"--tokenizer-type {self.tokenizer_type}: choose {' or '.join(TOKENIZER_TYPES)}"
            )


@dataclass(frozen=True, kw_only=True)
class SourceFlags(CheckedShapeFlags, TokenizerFlags, LoadFlags):
    """The flags that say which model runs and how: a ModelSource."""

    load: Path = restate(
        LoadFlags,
        "load",
        note="Or a Hugging Face GPT-2, Llama, GPT-NeoX or BLOOM folder (config.json, safetensors).",
    )
    # Unset: the checkpoint's tokenizer (a lone --tokenizer-type is checked against it).
    tokenizer_type: str | None = restate(
        TokenizerFlags, "tokenizer_type", default=None, shown_default="the checkpoint's tokenizer"
    )
    device: str = flag(
        "--device", default="auto", help="cpu, cuda, cuda:N or auto (cuda when available)."
    )
    dtype: str = flag(
        "--dtype",
        default="auto",
        help="auto (float32 on CPU, the checkpoint's half precision on a GPU), "
        "float32, bfloat16 or float16.",
    )
    bf16: bool = restate(HalfFlags, "bf16", note="As --dtype bfloat16.")
    fp16: bool = restate(HalfFlags, "fp16", note="As --dtype float16.")

    def tokenizer(self) -> TokenizerSpec | None:
        """The tokenizer the flags name, or None when they name no files (then the checkpoint's
        is used, and a lone --tokenizer-type is checked against it); a misplaced flag exits 2."""
        kind = self.tokenizer_type
        if not self.names_files:
            if kind is not None and kind not in TOKENIZER_TYPES:
                tokenizer_spec(TokenizerFlags(tokenizer_type=kind))  # the usage error
            return None
        return named_tokenizer_spec(self)

    def model_source(self, *, cuda_graphs: bool = True) -> ModelSource:
        dtype = self.dtype
        if self.bf16 and self.fp16:
            raise ValueError("--bf16 and --fp16 exclude each other")
        if self.bf16 or self.fp16:
            if dtype not in ("auto", "bfloat16" if self.bf16 else "float16"):
                raise ValueError(f"--{'bf16' if self.bf16 else 'fp16'} contradicts --dtype {dtype}")
            dtype = "bfloat16" if self.bf16 else "float16"
        return ModelSource(
            load=self.load,
            iteration=self.iteration,
            tokenizer=self.tokenizer(),
            tokenizer_type=self.tokenizer_type,
            device=self.device,
            dtype=dtype,
            cuda_graphs=cuda_graphs,
            expected_shape=self.given_shape(),
        )


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen from the logits of the real vocabulary (padding dropped).

    Order: repetition penalty, frequency penalty, then greedy argmax, or temperature, top-k,
    top-p and a draw (Megatron's order for the last three).
    """

    greedy: bool = flag("--greedy", default=False, help="Argmax instead of sampling.")
    temperature: float = flag("--temperature", default=1.0, help="Logits are divided by it.")
    top_k: int = flag("--top-k", default=0, help="Keep the k most likely tokens (0: off).")
    top_p: float = flag(  # 0: off (Megatron's default)
        "--top-p", default=0.0, help="Nucleus: smallest set reaching probability p (0: off)."
    )
    repetition_penalty: float = flag(
        "--repetition-penalty", default=1.0, help="CTRL's penalty on tokens already seen (1: off)."
    )
    frequency_penalty: float = flag(
        "--frequency-penalty",
        default=0.0,
        help="Subtracted per earlier occurrence in the completion (0: off).",
    )
    seed: int = flag("--seed", default=1234, help="Seed of the draws: same seed, same samples.")

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"--temperature must be > 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"--top-k must be >= 0 (0 is off), got {self.top_k}")
        if not 0.0 <= self.top_p <= 1.0:
            raise ValueError(f"--top-p must be in [0, 1] (0 is off), got {self.top_p}")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise ValueError(
                f"--repetition-penalty must be > 0 (1 is off), got {self.repetition_penalty}"
            )
        if not math.isfinite(self.frequency_penalty):
            raise ValueError(f"--frequency-penalty must be finite, got {self.frequency_penalty}")
        if self.seed < 0:
            raise ValueError(f"--seed must be >= 0, got {self.seed}")


@dataclass(frozen=True)
class GenerationConfig:
    """When a completion ends, and how its logits are computed."""

    max_new_tokens: int = flag(
        "--max-new-tokens", "--out-seq-length", default=1024, help="New tokens at most."
    )
    stop: tuple[str, ...] = flag(
        "--stop", multiple=True, default=(), help="End a completion at any of these strings."
    )
    stop_at_eod: bool = flag(
        "--ignore-eod", default=True, negates=True, help="Do not stop at end-of-document."
    )
    recompute: bool = flag(  # no KV cache: the cache's check
        "--recompute", default=False, help="No KV cache: full forward each step (check)."
    )
    context_length: int | None = flag(  # None: the model's max positions
        "--seq-length", help="Context window; default: the model's. Must not exceed it."
    )

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(
                f"--max-new-tokens (--out-seq-length) must be >= 1, got {self.max_new_tokens}"
            )
        if any(not s for s in self.stop):
            raise ValueError("--stop: an empty stop string would end every completion at once")
        if self.context_length is not None and self.context_length < 2:
            raise ValueError(f"--seq-length must be >= 2, got {self.context_length}")


@dataclass(frozen=True, kw_only=True)
class SampleConfig:
    """The sampling command: one of four modes, chosen by the flags given."""

    source: ModelSource
    sampling: SamplingConfig
    generation: GenerationConfig
    mode: str
    prompt: str | None = flag("--prompt", help="One prompt; the completion streams.")
    sample_input_file: Path | None = flag(
        "--sample-input-file", help="One prompt per line, every line (JSON lines out)."
    )
    sample_output_file: Path | None = flag(
        "--sample-output-file", help="JSON lines out; default: {sample-input-file}.out."
    )
    num_samples: int = flag(
        "--num-samples", default=0, help="Unconditional samples to write to --genfile (0: off)."
    )
    genfile: Path | None = flag("--genfile", help="Unconditional samples, JSON lines.")
    micro_batch_size: int = flag(
        "--micro-batch-size", "--batch-size", default=8, help="Rows run together."
    )
    log_interval: int = flag("--log-interval", default=100, help="Batches between timing lines.")

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}; got {self.mode!r}")
        if self.micro_batch_size < 1:
            raise ValueError(f"--micro-batch-size must be >= 1, got {self.micro_batch_size}")
        if self.log_interval < 1:
            raise ValueError(f"--log-interval must be >= 1, got {self.log_interval}")
        if self.mode == "unconditional" and (self.num_samples < 1 or self.genfile is None):
            raise ValueError("unconditional sampling needs --num-samples N (> 0) and --genfile F")
        if self.mode == "input-file" and self.sample_input_file is None:
            raise ValueError("--sample-input-file is missing")
        if self.mode == "prompt" and self.prompt is None:
            raise ValueError("--prompt is missing")

    @property
    def output_file(self) -> Path | None:
        """Megatron's default: `{input}.out` beside the prompt file."""
        if self.mode != "input-file":
            return None
        return self.sample_output_file or Path(f"{self.sample_input_file}.out")


def _one_file(paths: tuple[Path, ...]) -> Path:
    if len(paths) != 1:
        raise ValueError(f"--valid-data takes exactly one file, got {len(paths)}")
    return paths[0]


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """Zero-shot evaluation (Megatron's `tasks/main.py --task WIKITEXT103 | LAMBADA`)."""

    source: ModelSource
    task: str = flag(
        "--task", required=True, parse=str.lower, help="WIKITEXT103 or LAMBADA (any case)."
    )
    valid_data: Path = flag(
        "--valid-data",
        multiple=True,
        required=True,
        parse=_one_file,
        help="WikiText-103 test file (word level), or LAMBADA jsonl ('text').",
    )
    seq_length: int | None = restate(GenerationConfig, "context_length")  # None: the model's
    overlapping_eval: int = flag(
        "--overlapping-eval",
        default=32,
        help="WikiText windows start every N tokens; each scores its last N.",
    )
    strict_lambada: bool = flag(
        "--strict-lambada", default=False, help="Score the whole last word (papers' figure)."
    )
    micro_batch_size: int = restate(SampleConfig, "micro_batch_size")
    log_interval: int = flag("--log-interval", default=10, help="Batches between progress lines.")

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(
                f"--task must be one of {', '.join(t.upper() for t in TASKS)}; got {self.task!r}"
            )
        if self.seq_length is not None and self.seq_length < 2:
            raise ValueError(f"--seq-length must be >= 2, got {self.seq_length}")
        if self.overlapping_eval < 1:
            raise ValueError(f"--overlapping-eval must be >= 1, got {self.overlapping_eval}")
        if self.micro_batch_size < 1:
            raise ValueError(f"--micro-batch-size must be >= 1, got {self.micro_batch_size}")
        if self.log_interval < 1:
            raise ValueError(f"--log-interval must be >= 1, got {self.log_interval}")


def as_dict(config) -> dict:
    """The resolved config for the JSON written beside outputs (paths as strings)."""
    return json_ready(dataclasses.asdict(config))


def json_ready(value):
    if isinstance(value, dict):
        return {key: json_ready(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(item) for item in value]
    if isinstance(value, Path):
        return str(value)
    return value
