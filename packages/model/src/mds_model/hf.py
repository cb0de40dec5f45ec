"""Our GPT's weights <-> Hugging Face `transformers`' GPT2LMHeadModel, without importing it (the
other families, and the choice among them, are `hf_families.py`'s).

Only the learned-position GPT-2 architecture has a Hugging Face twin: pre-LayerNorm blocks,
a GeLU (tanh: "gelu_new"; exact: "gelu"), tied LM head. The differences are layout only: HF's
`Conv1D` stores weights as (in, out) where our linears store (out, in); HF's fused QKV columns are
[all q | all k | all v] where ours (Megatron checkpoint version >= 2) groups the rows per head as
[heads, 3, head_dim]; and our word embeddings carry Megatron's padding rows past the vocabulary.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping

import torch

from .arguments import ARGUMENTS, HF_ACTIVATION_OF, hf_gpt2_fields
from .config import ARCHITECTURE, GPT2, KIND, GPTConfig
from .naming import HF_QKV
from .parameters import layer_parameters

# Architecture fields GPT2LMHeadModel has no setting for, so it expresses GPT-2's value only: all
# but those with a GPT-2 config.json key (the argument rows'), the activation (its name) and the
# vocabulary (written as the tokenizer's, the padding rows dropped).
_EXPRESSED = {argument.field for argument in ARGUMENTS if argument.hf is not None}
_GPT2_ONLY = tuple(
    f.name
    for f in dataclasses.fields(GPTConfig)
    if f.metadata[KIND] == ARCHITECTURE
    and f.name not in _EXPRESSED | {"activation"}
    and f.metadata["compared_as"] != "padded_vocab_size"
)


def gpt2_problems(config: GPTConfig) -> list[str]:
    """Each reason GPT2LMHeadModel cannot hold this model, in a few words (none: it can)."""
    problems = []
    if config.activation not in HF_ACTIVATION_OF:
        problems.append(
            f"activation {config.activation!r} has no GPT2LMHeadModel equivalent (a GeLU)"
        )
    for name in _GPT2_ONLY:
        value = getattr(config, name)
        if value != GPT2[name]:
            problems.append(
                f"{name} {value!r} has no GPT2LMHeadModel equivalent (GPT-2's is {GPT2[name]!r})"
            )
    return problems


def gpt2_problem(config: GPTConfig) -> str | None:
    """Why GPT2LMHeadModel cannot hold this model, in a few words; None when it can (the one
    check of this module's converters; export-hf asks `hf_families.hf_adapter`)."""
    problems = gpt2_problems(config)
    return problems[0] if problems else None


def _check_gpt2_shaped(config: GPTConfig) -> None:
    problem = gpt2_problem(config)
    if problem is not None:
        raise ValueError(problem)


def hf_gpt2_config(config: GPTConfig, *, eos_token_id: int | None = None) -> dict:
    """The `config.json` of the Hugging Face GPT-2 with this architecture (`GPT2Config(**d)`).

    eos_token_id: the tokenizer's end-of-document id (50256 for GPT-2's), also used as BOS as
    GPT-2 does; None leaves both unset.
    """
    _check_gpt2_shaped(config)
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,  # the tokenizer's: padding rows are dropped on export
        **hf_gpt2_fields(config),  # the sizes, LayerNorm's epsilon, dropouts and init std
        "activation_function": HF_ACTIVATION_OF[config.activation],
        "embd_pdrop": config.hidden_dropout,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True,
        "bos_token_id": eos_token_id,
        "eos_token_id": eos_token_id,
    }


def _get(state_dict: Mapping[str, torch.Tensor], name: str, shape: tuple[int, ...]):
    if name not in state_dict:
        raise ValueError(
            f"the state dict has no {name!r}: expected a whole (TP=1 or merged) plain GPT state "
            "dict, as GPT.state_dict() names it"
        )
    tensor = state_dict[name]
    if tuple(tensor.shape) != shape:
        raise ValueError(
            f"{name} has shape {tuple(tensor.shape)}, expected {shape} for this config "
            "(a tensor-parallel shard? merge the shards first)"
        )
    return tensor


def to_hf_gpt2_state_dict(
    state_dict: Mapping[str, torch.Tensor], config: GPTConfig
) -> dict[str, torch.Tensor]:
    """Our plain GPT's whole state dict -> a `GPT2LMHeadModel` state dict (new tensors, same dtype).

    state_dict: `GPT.state_dict()` at TP=1, or TP shards merged along each parameter's
    `partition_dim`; config: the model's (padded for any tensor-parallel size: padding rows past
    `vocab_size` are dropped whatever their number). The tied `lm_head.weight` is left out, as
    `save_pretrained` leaves it out: `from_pretrained` ties it to `transformer.wte.weight`.
    """
    _check_gpt2_shaped(config)
    h, v = config.hidden_size, config.vocab_size
    heads, head_dim = config.num_attention_heads, config.head_dim
    words = state_dict.get("embedding.word_embeddings.weight")
    if words is None or words.dim() != 2 or words.shape[0] < v or words.shape[1] != h:
        raise ValueError(
            f"embedding.word_embeddings.weight must be ({config.padded_vocab_size}, {h}), got "
            f"{None if words is None else tuple(words.shape)}"
        )
    out = {
        "transformer.wte.weight": words[:v].clone(),
        "transformer.wpe.weight": _get(
            state_dict, "embedding.position_embeddings.weight", (config.max_positions, h)
        ).clone(),
        "transformer.ln_f.weight": _get(state_dict, "final_layernorm.weight", (h,)).clone(),
        "transformer.ln_f.bias": _get(state_dict, "final_layernorm.bias", (h,)).clone(),
    }
    for i in range(config.num_layers):
        ours, theirs = f"layers.{i}.", f"transformer.h.{i}."
        for param in layer_parameters(config, i):
            if param.hf_name is None:
                continue  # query_key_value: reordered below
            tensor = _get(state_dict, param.name, param.shape)
            tensor = tensor.t() if param.hf_transposed else tensor
            out[param.hf_name] = tensor.contiguous().clone()
        # Rows [heads, 3, head_dim] -> [3, heads, head_dim]: all q, then all k, then all v.
        weight = _get(state_dict, f"{ours}{HF_QKV}.weight", (3 * h, h))
        bias = _get(state_dict, f"{ours}{HF_QKV}.bias", (3 * h,))
        weight = weight.view(heads, 3, head_dim, h).transpose(0, 1).reshape(3 * h, h)
        out[theirs + "attn.c_attn.weight"] = weight.t().contiguous()
        out[theirs + "attn.c_attn.bias"] = bias.view(heads, 3, head_dim).transpose(0, 1).flatten()
    return out


def from_hf_gpt2_state_dict(
    hf_state_dict: Mapping[str, torch.Tensor], config: GPTConfig
) -> dict[str, torch.Tensor]:
    """A `GPT2LMHeadModel` state dict -> our plain GPT's (TP=1 layout) state dict.

    The inverse of `to_hf_gpt2_state_dict`; config must describe the HF model (`vocab_size`, shape);
    the padding rows of the word embeddings are zeros. Load with `GPT.load_state_dict`.
    """
    out: dict[str, torch.Tensor] = {}
    for part in from_hf_gpt2_parts(hf_state_dict, config):
        out.update(part)
    return out


def from_hf_gpt2_parts(
    hf_state_dict: Mapping[str, torch.Tensor], config: GPTConfig
) -> Iterator[dict[str, torch.Tensor]]:
    """`from_hf_gpt2_state_dict` one part at a time: the embeddings, each transformer layer, the
    final norm (new tensors). With a lazy mapping (one tensor read per lookup) a converter holds
    one part, never the whole model."""
    _check_gpt2_shaped(config)
    h, v = config.hidden_size, config.vocab_size
    heads, head_dim = config.num_attention_heads, config.head_dim
    wte = _get(hf_state_dict, "transformer.wte.weight", (v, h))
    words = wte.new_zeros(config.padded_vocab_size, h)
    words[:v] = wte
    del wte
    yield {
        "embedding.word_embeddings.weight": words,
        "embedding.position_embeddings.weight": _get(
            hf_state_dict, "transformer.wpe.weight", (config.max_positions, h)
        ).clone(),
    }
    for i in range(config.num_layers):
        ours, theirs = f"layers.{i}.", f"transformer.h.{i}."
        layer = {}
        for param in layer_parameters(config, i):
            if param.hf_name is None:
                continue  # query_key_value: reordered below
            transpose = param.hf_transposed
            tensor = _get(
                hf_state_dict, param.hf_name, param.shape[::-1] if transpose else param.shape
            )
            layer[param.name] = (tensor.t() if transpose else tensor).contiguous().clone()
        weight = _get(hf_state_dict, theirs + "attn.c_attn.weight", (h, 3 * h)).t()
        bias = _get(hf_state_dict, theirs + "attn.c_attn.bias", (3 * h,))
        weight = weight.reshape(3, heads, head_dim, h).transpose(0, 1).reshape(3 * h, h)
        layer[f"{ours}{HF_QKV}.weight"] = weight.contiguous()
        layer[f"{ours}{HF_QKV}.bias"] = bias.view(3, heads, head_dim).transpose(0, 1).flatten()
        yield layer
    yield {
        "final_layernorm.weight": _get(hf_state_dict, "transformer.ln_f.weight", (h,)).clone(),
        "final_layernorm.bias": _get(hf_state_dict, "transformer.ln_f.bias", (h,)).clone(),
    }
