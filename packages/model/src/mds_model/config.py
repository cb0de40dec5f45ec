"""The GPT model's shape and options as one frozen dataclass, with Megatron's argument names.

Vocabulary padding follows Megatron's `_vocab_size_with_padding`: the embedding row count is the
smallest multiple of `make_vocab_size_divisible_by` x the tensor-parallel size of the run that made
the model and holds the tokenizer's vocabulary (50257 -> 50304 at TP=1, 50432 at TP=2), unless
`pad_vocab_size_to` fixes it (BS). The config holds no parallel size: the rows are architecture
(a reshape keeps them), so `for_tensor_parallel` records them in `pad_vocab_size_to` where a
run's TP makes them differ from TP=1's, and `check_tensor_parallel` says whether a TP splits the
model; the degree itself is the process group's (mds_model.parallel).

Each field is marked (`KIND`): `architecture` fixes the parameters or the forward computation, so
a checkpoint's must match (`architecture_keys`, meta.json's names); `tunable` is a constant of the
forward math a resume may change on purpose, as upstream's checks let it; `run` is how this run
computes (kernels, dtype, dropout, sequence parallelism). Named presets (`ARCHITECTURES`) are
partial configs. It does not import torch (`torch_dtype` does, when asked): mds-merge-mp reads a
checkpoint's shape from here and reshapes it with numpy, without paying torch's import.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

POSITION_EMBEDDING_TYPES = ("learned", "rotary", "alibi")
ATTENTION_BACKENDS = ("auto", "flash", "sdpa", "cudnn", "softmax")
ACTIVATION_CHECKPOINTING = ("none", "full", "selective")
PARAMS_DTYPES = ("float32", "bfloat16", "float16")
# The MLP's GeLU -> F.gelu's `approximate`. gelu_tanh: Megatron's fused bias_gelu and openai_gelu
# (upstream's default); gelu: the exact erf GeLU of its unfused F.gelu (--no-bias-gelu-fusion).
ACTIVATIONS = {"gelu_tanh": "tanh", "gelu": "none"}
# Gated MLPs (Megatron-core's gated_linear_unit): dense_h_to_4h is [gate; up] on each TP rank,
# activation(gate) * up; upstream's --swiglu.
GATED_ACTIVATIONS = ("swiglu",)
NORMALIZATIONS = ("layernorm", "rmsnorm")

# Named architectures, GPTConfig fields over GPT-2's defaults (torchtitan's named model args).
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "gpt2": {},
    "bloom": {"position_embedding_type": "alibi", "embed_layernorm": True},
    # upstream's Llama scripts' flag block (examples_deepspeed/pretrain_llama*_distributed.sh)
    "llama": {
        "position_embedding_type": "rotary",
        "normalization": "rmsnorm",
        "activation": "swiglu",
        "add_bias_linear": False,
        "untie_embeddings_and_output_weights": True,
    },
    # GPT-NeoX's (transformers' GPTNeoXConfig defaults): a quarter of each head rotated, exact
    # GeLU, its own output layer
    "gpt_neox": {
        "position_embedding_type": "rotary",
        "rotary_percent": 0.25,
        "activation": "gelu",
        "untie_embeddings_and_output_weights": True,
    },
}

KIND = "kind"
ARCHITECTURE, TUNABLE, RUN = "architecture", "tunable", "run"


def _field(kind: str, default: Any, compared_as: str | None) -> Any:
    return dataclasses.field(default=default, metadata={KIND: kind, "compared_as": compared_as})


def _architecture(default: Any = dataclasses.MISSING, *, compared_as: str | None = None) -> Any:
    """A field that fixes the parameters or the forward math; meta.json compares it as itself or
    as the derived size `compared_as` it sets (with others)."""
    return _field(ARCHITECTURE, default, compared_as)


def _tunable(default: Any) -> Any:
    return _field(TUNABLE, default, None)


def _run(default: Any) -> Any:
    return _field(RUN, default, None)


def padded_vocab_size(
    vocab_size: int, *, make_vocab_size_divisible_by: int = 128, tensor_model_parallel_size: int = 1
) -> int:
    """Megatron's padding rule: round up to a multiple of divisible_by * TP."""
    multiple = make_vocab_size_divisible_by * tensor_model_parallel_size
    return math.ceil(vocab_size / multiple) * multiple


def for_tensor_parallel(config: GPTConfig, tensor_model_parallel_size: int) -> GPTConfig:
    """The model a run at this TP makes from `config` (flags, a Hugging Face config), as
    Megatron's arguments.py does: the vocabulary padded for the TP (recorded as the rows, unless
    `pad_vocab_size_to` fixes them) and sequence parallelism off at TP=1. ValueError where the
    TP does not split the model (`check_tensor_parallel`)."""
    tp = tensor_model_parallel_size
    changes: dict[str, Any] = {}
    if config.pad_vocab_size_to is None:
        rows = padded_vocab_size(
            config.vocab_size,
            make_vocab_size_divisible_by=config.make_vocab_size_divisible_by,
            tensor_model_parallel_size=tp,
        )
        if rows != config.padded_vocab_size:
            changes["pad_vocab_size_to"] = rows
    if tp == 1 and config.sequence_parallel:
        changes["sequence_parallel"] = False
    made = dataclasses.replace(config, **changes) if changes else config
    check_tensor_parallel(made, tp)
    return made


def check_tensor_parallel(config: GPTConfig, tensor_model_parallel_size: int) -> None:
    """ValueError, naming the field, unless this many tensor-parallel ranks split `config`'s heads,
    key/value groups, MLP, vocabulary rows and (with sequence parallelism) sequence evenly."""
    tp = tensor_model_parallel_size
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tensor_model_parallel_size must be a positive integer, got {tp!r}")
    checks = (
        ("num_attention_heads", config.num_attention_heads),
        ("num_query_groups", config.query_groups),
        ("ffn_hidden_size", config.ffn_size),
        ("padded_vocab_size", config.padded_vocab_size),
    )
    for name, value in checks:
        if value % tp and name == "padded_vocab_size" and config.pad_vocab_size_to is not None:
            # BS Megatron-DeepSpeed's --pad-vocab-size-to check, in its words
            raise ValueError(f"pad_vocab_size_to: {value} is not divisible by {tp}")
        if value % tp:
            raise ValueError(
                f"{name} ({value}) must be divisible by tensor_model_parallel_size ({tp})"
            )
    if config.sequence_parallel and tp == 1:
        raise ValueError(
            "sequence_parallel splits over tensor-parallel ranks: turn it off at "
            "tensor_model_parallel_size 1 (as Megatron does)"
        )
    if config.sequence_parallel and config.seq_length % tp:
        raise ValueError(
            f"sequence_parallel needs seq_length ({config.seq_length}) divisible by "
            f"tensor_model_parallel_size ({tp})"
        )


@dataclass(frozen=True)
class GPTConfig:
    """The model's architecture, and how a run computes it: each field's `KIND` says which."""

    num_layers: int = _architecture()
    hidden_size: int = _architecture()
    num_attention_heads: int = _architecture()
    vocab_size: int = _architecture(compared_as="padded_vocab_size")  # the tokenizer's
    seq_length: int = _run(1024)  # the sample length; the positions table is max_positions
    ffn_hidden_size: int | None = _architecture(None, compared_as="ffn_size")  # None: 4 x hidden
    max_position_embeddings: int | None = _architecture(None, compared_as="max_positions")
    make_vocab_size_divisible_by: int = _architecture(128, compared_as="padded_vocab_size")
    pad_vocab_size_to: int | None = _architecture(None, compared_as="padded_vocab_size")
    layernorm_epsilon: float = _tunable(1e-5)
    hidden_dropout: float = _run(0.1)
    attention_dropout: float = _run(0.1)
    init_method_std: float = _run(0.02)  # the initial weights' only
    position_embedding_type: str = _architecture("learned")
    rotary_base: float = _tunable(10000.0)  # upstream's --rotary-position-embeddings-theta
    rotary_percent: float = _architecture(1.0)  # rotate the first int(head_dim * p) dimensions
    embed_layernorm: bool = _architecture(False)
    activation: str = _architecture("gelu_tanh")  # a key of ACTIVATIONS
    # Megatron-core's names for the Llama family's choices (its TransformerConfig).
    normalization: str = _architecture("layernorm")
    num_query_groups: int | None = _architecture(None)  # key/value heads; None: one per head
    add_bias_linear: bool = _architecture(True)
    untie_embeddings_and_output_weights: bool = _architecture(False)
    use_fused_kernels: bool = _run(True)
    attention_backend: str = _run("auto")
    activation_checkpointing: str = _run("none")
    params_dtype: str = _run("float32")
    sequence_parallel: bool = _run(False)  # over TP > 1 ranks (for_tensor_parallel)

    def __post_init__(self) -> None:
        for name in (
            "num_layers",
            "hidden_size",
            "num_attention_heads",
            "vocab_size",
            "seq_length",
            "make_vocab_size_divisible_by",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads})"
            )
        if self.ffn_hidden_size is not None and self.ffn_hidden_size < 1:
            raise ValueError(f"ffn_hidden_size must be positive, got {self.ffn_hidden_size}")
        if (
            self.max_position_embeddings is not None
            and self.max_position_embeddings < self.seq_length
        ):
            raise ValueError(
                f"max_position_embeddings ({self.max_position_embeddings}) must be >= seq_length "
                f"({self.seq_length})"
            )
        if self.pad_vocab_size_to is not None:
            # Both checks and their wording follow BS Megatron-DeepSpeed's --pad-vocab-size-to.
            if self.pad_vocab_size_to < self.vocab_size:
                raise ValueError(
                    f"pad_vocab_size_to ({self.pad_vocab_size_to}) is smaller than vocab_size "
                    f"({self.vocab_size})"
                )
            if self.pad_vocab_size_to % self.make_vocab_size_divisible_by:
                raise ValueError(
                    f"pad_vocab_size_to: {self.pad_vocab_size_to} is not divisible by "
                    f"{self.make_vocab_size_divisible_by}"
                )
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.layernorm_epsilon <= 0:
            raise ValueError(f"layernorm_epsilon must be > 0, got {self.layernorm_epsilon}")
        if self.init_method_std <= 0:
            raise ValueError(f"init_method_std must be > 0, got {self.init_method_std}")
        _check_choice(
            "position_embedding_type", self.position_embedding_type, POSITION_EMBEDDING_TYPES
        )
        _check_choice("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        _check_choice(
            "activation_checkpointing", self.activation_checkpointing, ACTIVATION_CHECKPOINTING
        )
        _check_choice("params_dtype", self.params_dtype, PARAMS_DTYPES)
        _check_choice("activation", self.activation, (*ACTIVATIONS, *GATED_ACTIVATIONS))
        _check_choice("normalization", self.normalization, NORMALIZATIONS)
        groups = self.num_query_groups
        if groups is not None and (not isinstance(groups, int) or groups < 1):
            raise ValueError(f"num_query_groups must be a positive integer, got {groups!r}")
        if groups == self.num_attention_heads:  # one group per head is plain multi-head attention
            object.__setattr__(self, "num_query_groups", None)
        if self.num_attention_heads % self.query_groups:
            raise ValueError(
                f"num_query_groups ({self.query_groups}) must divide num_attention_heads "
                f"({self.num_attention_heads})"
            )
        if not 0.0 < self.rotary_percent <= 1.0:
            raise ValueError(f"rotary_percent must be in (0, 1], got {self.rotary_percent}")
        if self.rotary_positions and self.rotary_dim % 2:
            raise ValueError(
                "rotary position embeddings need an even number of rotated dimensions, got "
                f"{self.rotary_dim} (head dim {self.head_dim} x rotary_percent "
                f"{self.rotary_percent})"
            )

    @classmethod
    def preset(cls, name: str, **fields: Any) -> GPTConfig:
        """The named architecture (`ARCHITECTURES`) with these fields (sizes, run options)."""
        if name not in ARCHITECTURES:
            raise ValueError(
                f"architecture must be one of {', '.join(ARCHITECTURES)}; got {name!r}"
            )
        return cls(**{**ARCHITECTURES[name], **fields})

    @classmethod
    def fields_of_kind(cls, kind: str) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls) if f.metadata[KIND] == kind)

    @classmethod
    def architecture_keys(cls) -> tuple[str, ...]:
        """meta.json's `model` keys a checkpoint and the model loading it must agree on: each
        architecture field, or the derived size it is compared as, once, in field order."""
        return tuple(
            dict.fromkeys(
                f.metadata["compared_as"] or f.name
                for f in dataclasses.fields(cls)
                if f.metadata[KIND] == ARCHITECTURE
            )
        )

    @property
    def query_groups(self) -> int:
        """Key/value head groups: every head its own (GPT-2) unless num_query_groups says."""
        return self.num_query_groups or self.num_attention_heads

    @property
    def learned_positions(self) -> bool:
        """The embedding holds a learned position table (GPT-2's)."""
        return self.position_embedding_type == "learned"

    @property
    def rotary_positions(self) -> bool:
        """Queries and keys are rotated by their positions (upstream's rotary)."""
        return self.position_embedding_type == "rotary"

    @property
    def alibi_positions(self) -> bool:
        """Attention scores get ALiBi's per-head linear bias (BLOOM's)."""
        return self.position_embedding_type == "alibi"

    @property
    def explicit_attention_scores(self) -> bool:
        """Attention materialises the (S, S) scores: ALiBi's bias, or the softmax backend chosen.

        (Cached decoding also does for a query block shorter than its keys; that is per call.)
        """
        return self.alibi_positions or self.attention_backend == "softmax"

    @property
    def gelu_approximate(self) -> str:
        """The MLP's GeLU as F.gelu's and the kernels' `approximate`: "tanh" or "none"."""
        return ACTIVATIONS[self.activation]

    @property
    def gated(self) -> bool:
        """The MLP is gated: dense_h_to_4h holds [gate; up] (2 x ffn rows)."""
        return self.activation in GATED_ACTIVATIONS

    @property
    def ffn_size(self) -> int:
        """The MLP's inner size; by default 4 x hidden, or upstream's --swiglu rule
        int((4h * 2/3) / 64) * 64 (megatron/arguments.py)."""
        if self.ffn_hidden_size is not None:
            return self.ffn_hidden_size
        if self.gated:
            return int((4 * self.hidden_size * 2 / 3) / 64) * 64
        return 4 * self.hidden_size

    @property
    def rotary_dim(self) -> int:
        """The rotated dimensions of each head, upstream's int(head_dim * rotary_percent)."""
        return int(self.head_dim * self.rotary_percent)

    @property
    def qkv_size(self) -> int:
        """query_key_value's output rows: every head's query, each group's key and value."""
        return (self.num_attention_heads + 2 * self.query_groups) * self.head_dim

    @property
    def max_positions(self) -> int:
        return self.max_position_embeddings or self.seq_length

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def padded_vocab_size(self) -> int:
        if self.pad_vocab_size_to is not None:
            return self.pad_vocab_size_to
        return padded_vocab_size(
            self.vocab_size, make_vocab_size_divisible_by=self.make_vocab_size_divisible_by
        )

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.params_dtype)

    @property
    def output_layer_init_std(self) -> float:
        """Megatron's scaled init for the two output projections: std / sqrt(2 * num_layers)."""
        return self.init_method_std / math.sqrt(2.0 * self.num_layers)


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


# GPT-2's value of each field with a default: what an older meta.json without the field meant.
GPT2 = {
    f.name: f.default for f in dataclasses.fields(GPTConfig) if f.default is not dataclasses.MISSING
}
