"""GPTConfig's architecture under upstream's names: one row per Megatron argument (its pickled
`args` attribute, its command-line flag, Hugging Face GPT-2's `config.json` key), the position
types' names, Megatron's GeLU rule (megatron/model/transformer.py ParallelMLP) and transformers'
GeLU names.

Reading and writing upstream's `args` (mds_checkpoint.describe, upstream_state), Hugging Face's
GPT-2 config (mds_model.hf, mds_checkpoint.hf_folder) and mds-train's flags read these rows.
Imports neither torch nor the model code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import GPTConfig


@dataclass(frozen=True)
class Argument:
    """One of upstream's arguments for a GPTConfig field."""

    field: str  # GPTConfig's field
    arg: str  # the attribute of upstream's pickled argparse `args`
    flag: str  # upstream's command-line flag
    hf: str | None = None  # Hugging Face GPT2Config's key; None where GPT-2 has none
    read: Callable[[Any], Any] | None = None  # args' value -> the field's (None: as it is)
    written: str | None = None  # GPTConfig's derived size written instead of the field
    write: Callable[[Any], Any] | None = None  # the field's value -> args' type (None: as it is)

    def value(self, config: GPTConfig) -> Any:
        """The field as upstream's args and flags hold it."""
        value = getattr(config, self.written or self.field)
        return value if self.write is None else self.write(value)


def _integral(value: float) -> int | float:
    """An int where the value is one (upstream's argparse type=int), else the float as it is."""
    return int(value) if float(value).is_integer() else value


def _normalization(value: Any) -> str:
    return str(value).lower()  # Megatron-core's "LayerNorm"/"RMSNorm", deepspeedai's lower case


ARGUMENTS = (
    Argument("num_layers", "num_layers", "--num-layers", "n_layer", int),
    Argument("hidden_size", "hidden_size", "--hidden-size", "n_embd", int),
    Argument("num_attention_heads", "num_attention_heads", "--num-attention-heads", "n_head", int),
    # None fields (4 x hidden, seq_length) are written as the sizes they stand for
    Argument(
        "ffn_hidden_size", "ffn_hidden_size", "--ffn-hidden-size", "n_inner", written="ffn_size"
    ),
    Argument(
        "max_position_embeddings",
        "max_position_embeddings",
        "--max-position-embeddings",
        "n_positions",
        written="max_positions",
    ),
    Argument("seq_length", "seq_length", "--seq-length", read=int),
    Argument(
        "make_vocab_size_divisible_by",
        "make_vocab_size_divisible_by",
        "--make-vocab-size-divisible-by",
        read=int,
    ),
    Argument(
        "layernorm_epsilon", "layernorm_epsilon", "--layernorm-epsilon", "layer_norm_epsilon", float
    ),
    Argument("hidden_dropout", "hidden_dropout", "--hidden-dropout", "resid_pdrop", float),
    Argument("attention_dropout", "attention_dropout", "--attention-dropout", "attn_pdrop", float),
    Argument("init_method_std", "init_method_std", "--init-method-std", "initializer_range", float),
    Argument("embed_layernorm", "embed_layernorm", "--embed-layernorm", read=bool),
    Argument("normalization", "normalization", "--normalization", read=_normalization),
    Argument(
        "num_query_groups",
        "num_key_value_heads",  # deepspeedai's; Megatron-LM's num_query_groups
        "--num-key-value-heads",
        read=int,
        written="query_groups",
    ),
    # stored inverted: the flag is --disable-bias-linear (args.add_bias_linear False)
    Argument("add_bias_linear", "add_bias_linear", "--disable-bias-linear", read=bool),
    Argument(
        "untie_embeddings_and_output_weights",
        "untie_embeddings_and_output_weights",
        "--untie-embeddings-and-output-weights",
        read=bool,
    ),
    # upstream's --rotary-position-embeddings-theta is type=int: args hold an int
    Argument(
        "rotary_base",
        "rope_theta",
        "--rotary-position-embeddings-theta",
        read=float,
        write=_integral,
    ),
    Argument("rotary_percent", "rotary_percent", "--rotary-percent", read=float),
)
ARGUMENT_OF = {argument.field: argument for argument in ARGUMENTS}

# GPTConfig.activation's gated MLP: upstream's --swiglu (args.swiglu; Megatron-core's
# gated_linear_unit with SiLU), which wins over the GeLU switches (`activation_of`).
SWIGLU = Argument("activation", "swiglu", "--swiglu", read=bool)


# GPTConfig.position_embedding_type in upstream's args: Megatron-LM's strings (written; read with
# the older and flag spelling `absolute`) and bigscience's pickled enum (megatron/enums.py).
MEGATRON_POSITIONS = {"learned": "learned_absolute", "rotary": "rope", "alibi": "alibi"}
POSITION_OF_MEGATRON = {"absolute": "learned", **{n: p for p, n in MEGATRON_POSITIONS.items()}}
BIGSCIENCE_POSITIONS = {"rotary": 1, "learned": 2, "alibi": 3}
POSITION_OF_BIGSCIENCE = {number: position for position, number in BIGSCIENCE_POSITIONS.items()}


def activation_of(
    *, openai_gelu: Any, onnx_safe: Any, bias_gelu_fusion: Any, swiglu: Any = False
) -> str:
    """GPTConfig.activation as upstream's ParallelMLP picks it (megatron/model/transformer.py):
    swiglu first, then openai_gelu (tanh), else onnx_safe's erf_gelu (exact), else the fused
    bias_gelu (tanh) unless bias_gelu_fusion is off, leaving F.gelu (exact). Each is taken for
    its truth, as upstream's (`--onnx-safe False` is argparse `type=bool`: true);
    bias_gelu_fusion None is its default, on."""
    if swiglu:
        return "swiglu"
    if openai_gelu:
        return "gelu_tanh"
    if onnx_safe:
        return "gelu"
    return "gelu" if bias_gelu_fusion is not None and not bias_gelu_fusion else "gelu_tanh"


def gelu_args(activation: str) -> dict[str, Any]:
    """`activation_of`'s inverse as upstream's args, read back by it and by Hugging Face's
    convert_megatron_gpt2_checkpoint.py (gelu_fast if bias_gelu_fusion, else gelu_new if
    openai_gelu, else gelu). Tanh: openai_gelu (HF's gelu_new); exact: neither, so upstream's
    ParallelMLP runs F.gelu and HF picks gelu."""
    return dict(openai_gelu=activation == "gelu_tanh", bias_gelu_fusion=False, onnx_safe=None)


# transformers' activation_function -> GPTConfig.activation, the first of each written on export:
# gelu_new is Megatron's tanh formula (what Hugging Face's Megatron converter writes for
# openai_gelu), gelu torch's exact F.gelu. The other tanh ones are one formula (gelu_fast and
# gelu_accurate with their constants written differently: within 1e-12 of gelu_new in float64);
# gelu_python is gelu written with erf.
HF_ACTIVATIONS = {
    **dict.fromkeys(("gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu_accurate"), "gelu_tanh"),
    **dict.fromkeys(("gelu", "gelu_python"), "gelu"),
}
HF_ACTIVATION_OF = {activation: name for name, activation in reversed(HF_ACTIVATIONS.items())}


def hf_gpt2_fields(config: GPTConfig) -> dict[str, Any]:
    """The rows' Hugging Face GPT-2 keys with this config's values."""
    return {a.hf: a.value(config) for a in ARGUMENTS if a.hf is not None}


def fields_from_hf_gpt2(hf: dict[str, Any]) -> dict[str, Any]:
    """GPTConfig's fields that a GPT-2 config.json holds under the rows' keys (those present)."""
    return {a.field: hf[a.hf] for a in ARGUMENTS if a.hf is not None and a.hf in hf}


def written_args(config: GPTConfig) -> dict[str, Any]:
    """The rows' upstream `args` with this config's values, and its MLP's (`gelu_args`)."""
    args = {a.arg: a.value(config) for a in ARGUMENTS}
    args.update(gelu_args(config.activation), swiglu=config.activation == "swiglu")
    return args


def fields_from_args(args: Any) -> dict[str, Any]:
    """GPTConfig's fields that upstream's args hold under the rows' names (None: not given)."""
    fields = {}
    for argument in ARGUMENTS:
        value = getattr(args, argument.arg, None)
        if value is not None:
            fields[argument.field] = argument.read(value) if argument.read else value
    return fields
