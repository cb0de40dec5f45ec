"""Hugging Face `transformers` families both ways, one adapter per family (torchtitan's
`state_dict_adapter` shape): GPT2LMHeadModel (`hf.py`), LlamaForCausalLM, GPTNeoXForCausalLM and
BloomForCausalLM. Each says why it cannot hold a config (`problems`), writes and reads its
`config.json` (`hf_config`, `config_fields`) and converts whole state dicts (`to_hf`, `from_hf`,
`from_hf_parts` one part at a time). Names and shapes are `parameters.py`'s table (`hf_names`);
the adapter for a config is chosen in one place (`hf_adapter`), for a folder by its model_type.

Layouts: our query_key_value rows are [groups, heads/groups + 2, head_dim], which GPT-NeoX and
BLOOM store as they are (no grouping: [heads, 3, head_dim]) and Llama cuts into q_proj, k_proj,
v_proj (key/value head g serves query heads g x heads/groups onward, as `repeat_kv`);
dense_h_to_4h is [gate; up], Llama's gate_proj and up_proj. Rotary is rotate-half in all three.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from .arguments import HF_ACTIVATION_OF, HF_ACTIVATIONS
from .config import ARCHITECTURE, ARCHITECTURES, KIND, GPTConfig
from .config import GPT2 as GPT2_VALUES
from .hf import (
    from_hf_gpt2_parts,
    gpt2_problems,
    hf_gpt2_config,
    to_hf_gpt2_state_dict,
)
from .parameters import (
    BLOOM_HF,
    GATED,
    GPT2_HF,
    GPT_NEOX_HF,
    LLAMA_HF,
    QKV,
    Param,
    embedding_parameters,
    final_parameters,
    head_parameters,
    layer_parameters,
    parameters,
)

# Architecture fields the vocabulary padding decides: dropped on export (the tokenizer's rows).
_PADDING = {
    f.name
    for f in dataclasses.fields(GPTConfig)
    if f.metadata.get("compared_as") == "padded_vocab_size"
}
# in GPTConfig's field order, the order a family's refusals are told in
_ARCHITECTURE = tuple(
    f.name for f in dataclasses.fields(GPTConfig) if f.metadata[KIND] == ARCHITECTURE
)


class HFAdapter:
    """One Hugging Face family. Subclasses set the names and what the family can vary."""

    model_type: str  # config.json's
    architecture: str  # config.json's architectures[0]
    display: str  # the family in messages: "Llama's is ..."

    def problems(self, config: GPTConfig) -> list[str]:
        """Each reason this family cannot hold the config, in a few words (none: it can)."""
        raise NotImplementedError

    def problem(self, config: GPTConfig) -> str | None:
        problems = self.problems(config)
        return problems[0] if problems else None

    def check(self, config: GPTConfig) -> None:
        problem = self.problem(config)
        if problem is not None:
            raise ValueError(problem)

    def hf_config(self, config: GPTConfig, *, eos_token_id: int | None = None) -> dict[str, Any]:
        """The family's config.json for this architecture (vocab_size the tokenizer's)."""
        raise NotImplementedError

    def config_fields(self, hf: Mapping[str, Any], *, seq_length: int | None = None) -> dict:
        """GPTConfig's fields from the family's config.json; a ValueError (without the file's
        name) for a key missing or a setting mds GPTs do not implement."""
        raise NotImplementedError

    def to_hf(self, state: Mapping[str, torch.Tensor], config: GPTConfig) -> dict:
        """Our whole (TP=1 or merged) state dict -> the family's (padding rows dropped; a tied
        head left out, as save_pretrained leaves it out)."""
        raise NotImplementedError

    def from_hf_parts(
        self, hf_state: Mapping[str, torch.Tensor], config: GPTConfig
    ) -> Iterator[dict[str, torch.Tensor]]:
        """The family's state dict -> ours at TP=1, one part at a time (the embedding, each
        layer, the final norm with an untied head); padding rows are zeros."""
        raise NotImplementedError

    def from_hf(self, hf_state: Mapping[str, torch.Tensor], config: GPTConfig) -> dict:
        out: dict[str, torch.Tensor] = {}
        for part in self.from_hf_parts(hf_state, config):
            out.update(part)
        return out


class GPT2Adapter(HFAdapter):
    """GPT2LMHeadModel: learned positions, LayerNorm, a GeLU, biases, tied head (`hf.py`)."""

    model_type, architecture, display = GPT2_HF, "GPT2LMHeadModel", "GPT-2"

    def problems(self, config: GPTConfig) -> list[str]:
        return gpt2_problems(config)

    def hf_config(self, config: GPTConfig, *, eos_token_id: int | None = None) -> dict[str, Any]:
        return hf_gpt2_config(config, eos_token_id=eos_token_id)

    def config_fields(self, hf: Mapping[str, Any], *, seq_length: int | None = None) -> dict:
        from .arguments import fields_from_hf_gpt2

        activation = hf.get("activation_function", "gelu_new")  # GPT2Config's default
        if activation not in HF_ACTIVATIONS:
            raise ValueError(
                f"activation_function {activation!r}: mds GPTs compute a GeLU, one of "
                f"{', '.join(HF_ACTIVATIONS)}"
            )
        for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
            if hf.get(flag):
                raise ValueError(f"{flag} is set, which mds GPTs do not implement")
        if hf.get("scale_attn_weights") is False:
            raise ValueError("scale_attn_weights is false, which mds GPTs do not implement")
        # GPT2Config has defaults for these; a GPT-2 config.json states them (the first checked
        # is the sequence length's, unless given)
        _require(hf, "n_layer", "n_embd", "n_head", "vocab_size", "n_positions", seq=seq_length)
        fields = fields_from_hf_gpt2(hf)  # the other absent keys: GPT2Config's defaults
        fields["ffn_hidden_size"] = fields.get("ffn_hidden_size") or None  # null: 4 x n_embd
        return {
            **fields,
            "vocab_size": hf["vocab_size"],
            "seq_length": seq_length or hf["n_positions"],
            "activation": HF_ACTIVATIONS[activation],
        }

    def to_hf(self, state: Mapping[str, torch.Tensor], config: GPTConfig) -> dict:
        return to_hf_gpt2_state_dict(state, config)

    def from_hf_parts(self, hf_state, config):
        return from_hf_gpt2_parts(hf_state, config)


def _require(hf: Mapping[str, Any], *keys: str, seq: int | None) -> None:
    """Keys the family's config class has defaults for but mds will not guess; the last is the
    sequence length's, checked first unless --seq-length gives it."""
    order = keys if seq else (keys[-1], *keys[:-1])
    for key in order:
        if key not in hf:
            raise ValueError(f"no {key!r}")


class _TableAdapter(HFAdapter):
    """A family whose names are the table's `hf_names` and whose layouts are ours, or ours cut
    (QKV into q, k, v; GATED into gate, up)."""

    # The family's architecture preset (config.ARCHITECTURES): every architecture field its
    # config.json does not vary (`expressed`) and its function does not ignore (`ignored`: ALiBi
    # has no position table) is fixed at the preset's value (GPT-2's where the preset is silent).
    preset: str
    expressed: frozenset[str] = frozenset()
    ignored: frozenset[str] = frozenset()
    fixed: Mapping[str, Any] = {}  # field -> the only value the family holds (derived)
    why: Mapping[str, str] = {}  # field -> the parenthesis of its refusal, where not "X's is v"
    aliases: Mapping[str, str] = {}  # a name read -> its other spelling, read where it is absent

    def __init_subclass__(cls) -> None:
        values = {**GPT2_VALUES, **ARCHITECTURES[cls.preset]}
        free = cls.expressed | cls.ignored | _PADDING
        cls.fixed = {name: values[name] for name in _ARCHITECTURE if name not in free}

    def problems(self, config: GPTConfig) -> list[str]:
        problems = []
        for name, value in self.fixed.items():
            if getattr(config, name) != value:
                why = self.why.get(name, f"{self.display}'s is {value!r}")
                problems.append(
                    f"{name} {getattr(config, name)!r} has no {self.architecture} equivalent "
                    f"({why})"
                )
        return problems + self.more_problems(config)

    def more_problems(self, config: GPTConfig) -> list[str]:
        return []

    def _names(self, param: Param) -> str | tuple[str, ...]:
        names = param.hf_name_in(self.model_type)
        assert names is not None, (param.name, self.model_type)  # problems() refused it
        return names

    def to_hf(self, state: Mapping[str, torch.Tensor], config: GPTConfig) -> dict:
        self.check(config)
        out = {}
        for param in parameters(config):
            names, tensor = self._names(param), _ours(state, param, config)
            if isinstance(names, str):
                out[names] = tensor.contiguous().clone()
            else:
                for name, piece in zip(names, _cut(param, tensor, config), strict=True):
                    out[name] = piece.contiguous().clone()
        return out

    def from_hf_parts(self, hf_state, config):
        self.check(config)
        yield self._part(hf_state, config, embedding_parameters(config))
        for i in range(config.num_layers):
            yield self._part(hf_state, config, layer_parameters(config, i))
        yield self._part(hf_state, config, (*final_parameters(config), *head_parameters(config)))

    def _part(self, hf_state, config: GPTConfig, params: tuple[Param, ...]) -> dict:
        part = {}
        for param in params:
            names = self._names(param)
            if isinstance(names, str):
                rows = config.vocab_size if param.split.vocab else param.shape[0]
                if names not in hf_state and self.aliases.get(names) in hf_state:
                    names = self.aliases[names]
                tensor = _get(hf_state, names, (rows, *param.shape[1:]))
                if param.split.vocab:  # Megatron's padding rows: zeros
                    padded = tensor.new_zeros(param.shape)
                    padded[: config.vocab_size] = tensor
                    tensor = padded
                part[param.name] = tensor.contiguous().clone()
            else:
                shapes = _piece_shapes(param, config)
                pieces = [_get(hf_state, n, s) for n, s in zip(names, shapes, strict=True)]
                part[param.name] = _join(param, pieces, config).contiguous()
        return part


def _get(state: Mapping[str, torch.Tensor], name: str, shape: tuple[int, ...]) -> torch.Tensor:
    if name not in state:
        raise ValueError(f"the weights have no {name!r}")
    tensor = state[name]
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {tuple(shape)}")
    return tensor


def _ours(state: Mapping[str, torch.Tensor], param: Param, config: GPTConfig) -> torch.Tensor:
    """Our tensor of `param`, whole; vocabulary rows cut to the tokenizer's (any padding)."""
    if not param.split.vocab:
        if param.name not in state:
            raise ValueError(
                f"the state dict has no {param.name!r}: expected a whole (TP=1 or merged) plain "
                "GPT state dict, as GPT.state_dict() names it"
            )
        tensor = state[param.name]
        if tuple(tensor.shape) != param.shape:
            raise ValueError(
                f"{param.name} has shape {tuple(tensor.shape)}, expected {param.shape} for this "
                "config (a tensor-parallel shard? merge the shards first)"
            )
        return tensor
    tensor, (v, h) = state.get(param.name), (config.vocab_size, config.hidden_size)
    if tensor is None or tensor.dim() != 2 or tensor.shape[0] < v or tensor.shape[1] != h:
        raise ValueError(
            f"{param.name} must be ({config.padded_vocab_size}, {h}), got "
            f"{None if tensor is None else tuple(tensor.shape)}"
        )
    return tensor[:v]


def _piece_shapes(param: Param, config: GPTConfig) -> list[tuple[int, ...]]:
    rest = param.shape[1:]
    if param.split.kind == QKV:
        kv = config.query_groups * config.head_dim
        return [(config.num_attention_heads * config.head_dim, *rest), (kv, *rest), (kv, *rest)]
    assert param.split.kind == GATED, param
    return [(config.ffn_size, *rest)] * 2


def _cut(param: Param, tensor: torch.Tensor, config: GPTConfig) -> tuple[torch.Tensor, ...]:
    """Our rows -> the family's pieces: QKV [groups, per_group + 2, head_dim] -> q, k, v; GATED
    [gate; up] -> gate, up."""
    if param.split.kind == GATED:
        return tuple(tensor.chunk(2))
    groups, hd = config.query_groups, config.head_dim
    per_group = config.num_attention_heads // groups
    rows = tensor.reshape(groups, per_group + 2, hd, *tensor.shape[1:])
    flat = (-1, *tensor.shape[1:])
    return (
        rows[:, :per_group].reshape(flat),
        rows[:, per_group].reshape(flat),
        rows[:, per_group + 1].reshape(flat),
    )


def _join(param: Param, pieces: list[torch.Tensor], config: GPTConfig) -> torch.Tensor:
    """`_cut`'s inverse."""
    if param.split.kind == GATED:
        return torch.cat(pieces)
    q, k, v = pieces
    groups, hd, rest = config.query_groups, config.head_dim, q.shape[1:]
    q = q.reshape(groups, config.num_attention_heads // groups, hd, *rest)
    k, v = (t.reshape(groups, 1, hd, *rest) for t in (k, v))
    return torch.cat([q, k, v], dim=1).reshape(-1, *rest)


def _rope(hf: Mapping[str, Any], *, theta: float, partial: float) -> tuple[float, float]:
    """(theta, partial rotary factor) of a config.json, transformers 5's `rope_parameters` or 4's
    top-level keys (defaults: the family's); other rope types are refused."""
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    kind = params.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    if kind != "default":
        raise ValueError(f"rope_type {kind!r}: mds GPTs implement the default rotary only")
    return (
        float(params.get("rope_theta", hf.get("rope_theta", theta))),
        float(params.get("partial_rotary_factor", hf.get("partial_rotary_factor", partial))),
    )


_SIZES = frozenset({"num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size"})


class LlamaAdapter(_TableAdapter):
    """LlamaForCausalLM: rotary over whole heads, RMSNorm, SwiGLU, grouped-query attention;
    biases (attention_bias and mlp_bias together) and a tied head as the config says."""

    model_type, architecture, display = LLAMA_HF, "LlamaForCausalLM", "Llama"
    preset = "llama"
    expressed = _SIZES | {
        "max_position_embeddings",
        "num_query_groups",
        "add_bias_linear",
        "untie_embeddings_and_output_weights",
    }
    why = {"rotary_percent": "LlamaConfig rotates whole heads"}

    def hf_config(self, config: GPTConfig, *, eos_token_id: int | None = None) -> dict[str, Any]:
        self.check(config)
        return {
            "architectures": [self.architecture],
            "model_type": self.model_type,
            "vocab_size": config.vocab_size,  # the tokenizer's: padding rows are dropped
            "hidden_size": config.hidden_size,
            "intermediate_size": config.ffn_size,
            "num_hidden_layers": config.num_layers,
            "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": config.query_groups,
            "head_dim": config.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": config.max_positions,
            "rms_norm_eps": config.layernorm_epsilon,
            "rope_parameters": {"rope_type": "default", "rope_theta": config.rotary_base},
            "rope_theta": config.rotary_base,  # transformers 4's key, beside 5's
            "attention_bias": config.add_bias_linear,
            "mlp_bias": config.add_bias_linear,
            "attention_dropout": config.attention_dropout,
            "initializer_range": config.init_method_std,
            "tie_word_embeddings": not config.untie_embeddings_and_output_weights,
            "bos_token_id": eos_token_id,
            "eos_token_id": eos_token_id,
        }

    def config_fields(self, hf: Mapping[str, Any], *, seq_length: int | None = None) -> dict:
        _require(
            hf,
            *("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size"),
            *("intermediate_size", "max_position_embeddings"),
            seq=seq_length,
        )
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {hf['hidden_act']!r}: mds's Llama MLP is SwiGLU (silu)")
        theta, partial = _rope(hf, theta=10000.0, partial=1.0)
        if partial != 1.0:
            raise ValueError(
                f"partial_rotary_factor {partial}: LlamaForCausalLM rotates whole heads"
            )
        hidden, heads = hf["hidden_size"], hf["num_attention_heads"]
        if hf.get("head_dim") not in (None, hidden // heads):
            raise ValueError(
                f"head_dim {hf['head_dim']}: mds GPTs' heads are hidden_size / "
                f"num_attention_heads ({hidden // heads})"
            )
        bias, mlp_bias = bool(hf.get("attention_bias", False)), bool(hf.get("mlp_bias", False))
        if bias != mlp_bias:
            raise ValueError(
                f"attention_bias {bias} with mlp_bias {mlp_bias}: mds GPTs have one switch for "
                "every linear's bias (add_bias_linear)"
            )
        return {
            **ARCHITECTURES[self.preset],
            "num_layers": hf["num_hidden_layers"],
            "hidden_size": hidden,
            "num_attention_heads": heads,
            "num_query_groups": hf.get("num_key_value_heads") or heads,
            "vocab_size": hf["vocab_size"],
            "ffn_hidden_size": hf["intermediate_size"],
            "max_position_embeddings": hf["max_position_embeddings"],
            "seq_length": seq_length or hf["max_position_embeddings"],
            "layernorm_epsilon": float(hf.get("rms_norm_eps", 1e-6)),  # LlamaConfig's default
            "rotary_base": theta,
            "add_bias_linear": bias,
            "untie_embeddings_and_output_weights": not hf.get("tie_word_embeddings", False),
            "init_method_std": hf.get("initializer_range", 0.02),
            "hidden_dropout": 0.0,
            "attention_dropout": float(hf.get("attention_dropout", 0.0)),
        }


class GPTNeoXAdapter(_TableAdapter):
    """GPTNeoXForCausalLM with sequential residuals (use_parallel_residual false): rotary, whole
    or partial (partial_rotary_factor), LayerNorm, a GeLU, biases, its own lm_head (GPT-NeoX's
    checkpoints are untied; a tied one is refused, keeping the family choice one-to-one)."""

    model_type, architecture, display = GPT_NEOX_HF, "GPTNeoXForCausalLM", "GPT-NeoX"
    preset = "gpt_neox"
    expressed = _SIZES | {"max_position_embeddings", "rotary_percent", "activation"}
    why = {"num_query_groups": "GPT-NeoX has a key/value head per query head"}
    # Its files call the head embed_out (transformers 4's module; 5 saves it so and loads both),
    # transformers 5's module lm_head.
    aliases = {"embed_out.weight": "lm_head.weight"}

    def more_problems(self, config: GPTConfig) -> list[str]:
        if config.activation in HF_ACTIVATION_OF:
            return []
        return [f"activation {config.activation!r} has no {self.architecture} equivalent (a GeLU)"]

    def hf_config(self, config: GPTConfig, *, eos_token_id: int | None = None) -> dict[str, Any]:
        self.check(config)
        return {
            "architectures": [self.architecture],
            "model_type": self.model_type,
            "vocab_size": config.vocab_size,
            "hidden_size": config.hidden_size,
            "intermediate_size": config.ffn_size,
            "num_hidden_layers": config.num_layers,
            "num_attention_heads": config.num_attention_heads,
            "hidden_act": HF_ACTIVATION_OF[config.activation],
            "max_position_embeddings": config.max_positions,
            "layer_norm_eps": config.layernorm_epsilon,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": config.rotary_base,
                "partial_rotary_factor": config.rotary_percent,
            },
            # transformers 4's keys, beside 5's (its rotary_pct default is 0.25)
            "rotary_pct": config.rotary_percent,
            "rotary_emb_base": config.rotary_base,
            "use_parallel_residual": False,
            "attention_bias": True,
            "attention_dropout": config.attention_dropout,
            "hidden_dropout": config.hidden_dropout,
            "initializer_range": config.init_method_std,
            "tie_word_embeddings": False,
            "bos_token_id": eos_token_id,
            "eos_token_id": eos_token_id,
        }

    def config_fields(self, hf: Mapping[str, Any], *, seq_length: int | None = None) -> dict:
        _require(
            hf,
            *("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size"),
            *("intermediate_size", "max_position_embeddings"),
            seq=seq_length,
        )
        activation = hf.get("hidden_act", "gelu")  # GPTNeoXConfig's default
        if activation not in HF_ACTIVATIONS:
            raise ValueError(
                f"hidden_act {activation!r}: mds GPTs compute a GeLU, one of "
                f"{', '.join(HF_ACTIVATIONS)}"
            )
        if hf.get("use_parallel_residual", True):  # GPTNeoXConfig's default
            raise ValueError(
                "use_parallel_residual is true (GPT-NeoX's default), which mds GPTs do not "
                "implement (their residuals are sequential)"
            )
        if not hf.get("attention_bias", True):
            raise ValueError("attention_bias is false: mds GPTs bias every linear or none")
        if hf.get("tie_word_embeddings", False):
            raise ValueError("tie_word_embeddings is true: mds reads GPT-NeoX with its own lm_head")
        # transformers 4's names and defaults where 5's rope_parameters is absent
        theta, partial = _rope(
            {"rope_theta": hf.get("rotary_emb_base", 10000.0), **hf},
            theta=10000.0,
            partial=hf.get("rotary_pct", 0.25),
        )
        return {
            "num_layers": hf["num_hidden_layers"],
            "hidden_size": hf["hidden_size"],
            "num_attention_heads": hf["num_attention_heads"],
            "vocab_size": hf["vocab_size"],
            "ffn_hidden_size": hf["intermediate_size"],
            "max_position_embeddings": hf["max_position_embeddings"],
            "seq_length": seq_length or hf["max_position_embeddings"],
            "layernorm_epsilon": float(hf.get("layer_norm_eps", 1e-5)),
            **ARCHITECTURES[self.preset],
            "rotary_base": theta,
            "rotary_percent": partial,
            "activation": HF_ACTIVATIONS[activation],
            "init_method_std": hf.get("initializer_range", 0.02),
            "hidden_dropout": float(hf.get("hidden_dropout", 0.0)),
            "attention_dropout": float(hf.get("attention_dropout", 0.0)),
        }


class BloomAdapter(_TableAdapter):
    """BloomForCausalLM: ALiBi, the LayerNorm on the word embeddings, LayerNorm, the tanh GeLU,
    biases, an MLP of 4 x hidden; the head tied or not (tie_word_embeddings)."""

    model_type, architecture, display = BLOOM_HF, "BloomForCausalLM", "BLOOM"
    preset = "bloom"
    expressed = _SIZES - {"ffn_hidden_size"} | {"untie_embeddings_and_output_weights"}
    # ALiBi has no position table; the rotary fields are not read
    ignored = frozenset({"max_position_embeddings", "rotary_percent", "ffn_hidden_size"})
    why = {"num_query_groups": "BLOOM has a key/value head per query head"}

    def more_problems(self, config: GPTConfig) -> list[str]:
        if config.ffn_size == 4 * config.hidden_size:
            return []
        return [
            f"ffn_hidden_size {config.ffn_size} has no {self.architecture} equivalent (BLOOM's "
            f"is 4 x hidden_size, {4 * config.hidden_size})"
        ]

    def hf_config(self, config: GPTConfig, *, eos_token_id: int | None = None) -> dict[str, Any]:
        self.check(config)
        return {
            "architectures": [self.architecture],
            "model_type": self.model_type,
            "vocab_size": config.vocab_size,
            "hidden_size": config.hidden_size,
            "n_layer": config.num_layers,
            "n_head": config.num_attention_heads,
            "layer_norm_epsilon": config.layernorm_epsilon,
            "apply_residual_connection_post_layernorm": False,
            "pretraining_tp": 1,
            "slow_but_exact": False,
            "hidden_dropout": config.hidden_dropout,
            "attention_dropout": config.attention_dropout,
            "initializer_range": config.init_method_std,
            "tie_word_embeddings": not config.untie_embeddings_and_output_weights,
            "seq_length": config.seq_length,  # bigscience's key; BloomConfig keeps it as is
            "bos_token_id": eos_token_id,
            "eos_token_id": eos_token_id,
        }

    def config_fields(self, hf: Mapping[str, Any], *, seq_length: int | None = None) -> dict:
        hf = {"n_layer": hf.get("num_hidden_layers"), "hidden_size": hf.get("n_embed"), **hf}
        hf = {key: value for key, value in hf.items() if value is not None}
        for key in ("n_layer", "hidden_size", "n_head", "vocab_size"):
            if key not in hf:
                raise ValueError(f"no {key!r}")
        if hf.get("apply_residual_connection_post_layernorm"):
            raise ValueError(
                "apply_residual_connection_post_layernorm is set, which mds GPTs do not implement"
            )
        return {
            **ARCHITECTURES[self.preset],
            "num_layers": hf["n_layer"],
            "hidden_size": hf["hidden_size"],
            "num_attention_heads": hf["n_head"],
            "vocab_size": hf["vocab_size"],
            # ALiBi has no position table: the sample length is a run setting (BLOOM's 2048)
            "seq_length": seq_length or hf.get("seq_length", 2048),
            "layernorm_epsilon": float(hf.get("layer_norm_epsilon", 1e-5)),
            "untie_embeddings_and_output_weights": not hf.get("tie_word_embeddings", True),
            "init_method_std": hf.get("initializer_range", 0.02),
            "hidden_dropout": float(hf.get("hidden_dropout", 0.0)),
            "attention_dropout": float(hf.get("attention_dropout", 0.0)),
        }


GPT2 = GPT2Adapter()
LLAMA = LlamaAdapter()
GPT_NEOX = GPTNeoXAdapter()
BLOOM = BloomAdapter()
# In order of preference where a config fits none: the closest family's first reason is told.
HF_ADAPTERS = (GPT2, LLAMA, GPT_NEOX, BLOOM)
_BY_MODEL_TYPE = {adapter.model_type: adapter for adapter in HF_ADAPTERS}
_BY_ARCHITECTURE = {adapter.architecture: adapter for adapter in HF_ADAPTERS}


def hf_problem(config: GPTConfig) -> str | None:
    """None when a family holds the config; else why not, as the closest family (fewest reasons;
    the first of HF_ADAPTERS among equals) says it."""
    problems = min((adapter.problems(config) for adapter in HF_ADAPTERS), key=len)
    return problems[0] if problems else None


def hf_adapter(config: GPTConfig) -> HFAdapter:
    """The family that holds the config (the one place it is chosen); ValueError(hf_problem)."""
    for adapter in HF_ADAPTERS:
        if not adapter.problems(config):
            return adapter
    raise ValueError(hf_problem(config))


def hf_adapter_of_folder(hf: Mapping[str, Any]) -> HFAdapter:
    """The family of a config.json: its model_type, else its architectures; ValueError (without
    the file's name) for another."""
    model_type = hf.get("model_type")
    if model_type in _BY_MODEL_TYPE:
        return _BY_MODEL_TYPE[model_type]
    for architecture in hf.get("architectures") or ():
        if architecture in _BY_ARCHITECTURE:
            return _BY_ARCHITECTURE[architecture]
    known = ", ".join(repr(adapter.model_type) for adapter in HF_ADAPTERS)
    raise ValueError(f"model_type is {model_type!r}; mds reads Hugging Face folders of {known}")
