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

from mds_tokenize.interface import TOKENIZER_TYPES, TokenizerSpec

DTYPES = ("auto", "float32", "bfloat16", "float16")
MODES = ("prompt", "input-file", "unconditional", "interactive")
TASKS = ("wikitext103", "lambada")


@dataclass(frozen=True)
class ModelSource:
    """An mds checkpoint (`--load` folder with `latest`, or one `global_stepN`) or a Hugging Face
    GPT-2 folder. The tokenizer defaults to the checkpoint's (meta.json's `tokenizer`, or the
    folder's tokenizer.json / vocab.json + merges.txt); `tokenizer_type` alone only checks it."""

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


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen from the logits of the real vocabulary (padding dropped).

    Order: repetition penalty, frequency penalty, then greedy argmax, or temperature, top-k,
    top-p and a draw (Megatron's order for the last three).
    """

    greedy: bool = False
    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 0.0  # 0: off (Megatron's default)
    repetition_penalty: float = 1.0  # 1: off
    frequency_penalty: float = 0.0  # 0: off
    seed: int = 1234

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

    max_new_tokens: int = 1024
    stop: tuple[str, ...] = ()
    stop_at_eod: bool = True
    recompute: bool = False  # full forward each step (no KV cache): the cache's check
    context_length: int | None = None  # None: the model's max positions

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(
                f"--max-new-tokens (--out-seq-length) must be >= 1, got {self.max_new_tokens}"
            )
        if any(not s for s in self.stop):
            raise ValueError("--stop: an empty stop string would end every completion at once")
        if self.context_length is not None and self.context_length < 2:
            raise ValueError(f"--seq-length must be >= 2, got {self.context_length}")


@dataclass(frozen=True)
class SampleConfig:
    """The sampling command: one of four modes, chosen by the flags given."""

    source: ModelSource
    sampling: SamplingConfig
    generation: GenerationConfig
    mode: str
    prompt: str | None = None
    sample_input_file: Path | None = None
    sample_output_file: Path | None = None
    num_samples: int = 0
    genfile: Path | None = None
    micro_batch_size: int = 8
    log_interval: int = 100

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


@dataclass(frozen=True)
class EvalConfig:
    """Zero-shot evaluation (Megatron's `tasks/main.py --task WIKITEXT103 | LAMBADA`)."""

    source: ModelSource
    task: str
    valid_data: Path
    seq_length: int | None = None  # None: the model's
    overlapping_eval: int = 32
    strict_lambada: bool = False
    micro_batch_size: int = 8
    log_interval: int = 10

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
