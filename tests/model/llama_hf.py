"""Our Llama-family GPT's weights under transformers' names, both ways, written from the layouts
upstream's code defines (../shared/data/megatron-deepspeed-llama-golden/README.md) and
transformers' LlamaForCausalLM and GPTNeoXForCausalLM: the tests' bridge to models we did not
write. Our query_key_value rows are [groups, heads/groups + 2, head_dim] (each group's queries,
its key, its value); dense_h_to_4h is [gate; up] at TP=1."""

from __future__ import annotations

import torch
import transformers
from mds_model import GPTConfig


def llama_config(config: GPTConfig) -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        vocab_size=config.padded_vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.ffn_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.query_groups,
        max_position_embeddings=config.max_positions,
        rms_norm_eps=config.layernorm_epsilon,
        rope_theta=config.rotary_base,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        attn_implementation="eager",
    )


def _qkv_parts(config: GPTConfig, qkv: torch.Tensor) -> tuple[torch.Tensor, ...]:
    groups, hd = config.query_groups, config.head_dim
    per_group = config.num_attention_heads // groups
    rows = qkv.reshape(groups, per_group + 2, hd, *qkv.shape[1:])
    flat = (-1, *qkv.shape[1:])
    return (
        rows[:, :per_group].reshape(flat),
        rows[:, per_group].reshape(flat),
        rows[:, per_group + 1].reshape(flat),
    )


def _qkv_whole(config: GPTConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    groups, hd = config.query_groups, config.head_dim
    per_group = config.num_attention_heads // groups
    rest = q.shape[1:]
    q = q.reshape(groups, per_group, hd, *rest)
    k, v = (t.reshape(groups, 1, hd, *rest) for t in (k, v))
    return torch.cat([q, k, v], dim=1).reshape(-1, *rest)


def to_hf_llama(state: dict[str, torch.Tensor], config: GPTConfig) -> dict[str, torch.Tensor]:
    """Our TP=1 state dict (or gradients by name) -> LlamaForCausalLM's."""
    ffn = config.ffn_size
    out = {
        "model.embed_tokens.weight": state["embedding.word_embeddings.weight"],
        "model.norm.weight": state["final_layernorm.weight"],
        "lm_head.weight": state["output_layer.weight"],
    }
    for i in range(config.num_layers):
        ours, theirs = f"layers.{i}.", f"model.layers.{i}."
        q, k, v = _qkv_parts(config, state[ours + "self_attention.query_key_value.weight"])
        h_to_4h = state[ours + "mlp.dense_h_to_4h.weight"]
        out |= {
            theirs + "input_layernorm.weight": state[ours + "input_layernorm.weight"],
            theirs + "post_attention_layernorm.weight": state[
                ours + "post_attention_layernorm.weight"
            ],
            theirs + "self_attn.q_proj.weight": q,
            theirs + "self_attn.k_proj.weight": k,
            theirs + "self_attn.v_proj.weight": v,
            theirs + "self_attn.o_proj.weight": state[ours + "self_attention.dense.weight"],
            theirs + "mlp.gate_proj.weight": h_to_4h[:ffn],
            theirs + "mlp.up_proj.weight": h_to_4h[ffn:],
            theirs + "mlp.down_proj.weight": state[ours + "mlp.dense_4h_to_h.weight"],
        }
    return {name: tensor.contiguous() for name, tensor in out.items()}


def from_hf_llama(hf: dict[str, torch.Tensor], config: GPTConfig) -> dict[str, torch.Tensor]:
    """LlamaForCausalLM's state dict (or gradients by name) -> ours at TP=1."""
    out = {
        "embedding.word_embeddings.weight": hf["model.embed_tokens.weight"],
        "final_layernorm.weight": hf["model.norm.weight"],
        "output_layer.weight": hf["lm_head.weight"],
    }
    for i in range(config.num_layers):
        ours, theirs = f"layers.{i}.", f"model.layers.{i}."
        attn, mlp = theirs + "self_attn.", theirs + "mlp."
        out |= {
            ours + "input_layernorm.weight": hf[theirs + "input_layernorm.weight"],
            ours + "post_attention_layernorm.weight": hf[
                theirs + "post_attention_layernorm.weight"
            ],
            ours + "self_attention.query_key_value.weight": _qkv_whole(
                config,
                hf[attn + "q_proj.weight"],
                hf[attn + "k_proj.weight"],
                hf[attn + "v_proj.weight"],
            ),
            ours + "self_attention.dense.weight": hf[attn + "o_proj.weight"],
            ours + "mlp.dense_h_to_4h.weight": torch.cat(
                [hf[mlp + "gate_proj.weight"], hf[mlp + "up_proj.weight"]]
            ),
            ours + "mlp.dense_4h_to_h.weight": hf[mlp + "down_proj.weight"],
        }
    return out


def hf_llama(state: dict[str, torch.Tensor], config: GPTConfig) -> transformers.LlamaForCausalLM:
    """LlamaForCausalLM in fp32 holding our TP=1 weights."""
    model = transformers.LlamaForCausalLM(llama_config(config)).float()
    missing, unexpected = model.load_state_dict(to_hf_llama(state, config), strict=False)
    assert not [k for k in missing if "rotary" not in k] and not unexpected, (missing, unexpected)
    return model


def hf_gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad for name, p in model.named_parameters()}
