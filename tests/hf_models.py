"""Tiny random transformers models of each Hugging Face family past GPT-2 that mds reads and
writes: the zoo the checkpoint tests (import-hf / export-hf) and the generate tests share."""

from __future__ import annotations

from collections.abc import Callable

import transformers

# The class each family's folder names in its config.json (`architectures`).
HF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "llama-tied-biases": "LlamaForCausalLM",
    "gpt-neox": "GPTNeoXForCausalLM",
    "bloom": "BloomForCausalLM",
}


def tiny_hf_models(
    *, max_position_embeddings: int, **common
) -> dict[str, Callable[[], transformers.PreTrainedModel]]:
    """name -> a builder of a fresh model, two layers each; `common`: the config keys every
    family takes (vocab_size, token ids, attn_implementation)."""
    positions = max_position_embeddings
    return {
        # grouped-query attention (2 key/value heads for 8), an untied head, Llama 3's theta
        "llama": lambda: transformers.LlamaForCausalLM(
            transformers.LlamaConfig(
                **common,
                hidden_size=64,
                num_attention_heads=8,
                num_key_value_heads=2,
                num_hidden_layers=2,
                intermediate_size=96,
                max_position_embeddings=positions,
                rope_theta=500000.0,
                rms_norm_eps=1e-5,
                tie_word_embeddings=False,
            )
        ),
        # multi-head attention, a tied head, biases in attention and the MLP
        "llama-tied-biases": lambda: transformers.LlamaForCausalLM(
            transformers.LlamaConfig(
                **common,
                hidden_size=64,
                num_attention_heads=4,
                num_key_value_heads=4,
                num_hidden_layers=2,
                intermediate_size=96,
                max_position_embeddings=positions,
                attention_bias=True,
                mlp_bias=True,
                tie_word_embeddings=True,
            )
        ),
        # half of each head rotated, sequential residuals, its own output layer, exact GeLU
        "gpt-neox": lambda: transformers.GPTNeoXForCausalLM(
            transformers.GPTNeoXConfig(
                **common,
                hidden_size=64,
                num_attention_heads=4,
                num_hidden_layers=2,
                intermediate_size=160,
                max_position_embeddings=positions,
                rope_parameters={
                    "rope_type": "default",
                    "rope_theta": 20000.0,
                    "partial_rotary_factor": 0.5,
                },
                use_parallel_residual=False,
                tie_word_embeddings=False,
                hidden_act="gelu",
            )
        ),
        # 6 heads: ALiBi's slopes for a head count other than a power of two (BLOOM's and Press's)
        "bloom": lambda: transformers.BloomForCausalLM(
            transformers.BloomConfig(
                **common,
                hidden_size=72,
                n_layer=2,
                n_head=6,
                hidden_dropout=0.0,
                attention_dropout=0.0,
            )
        ),
    }
