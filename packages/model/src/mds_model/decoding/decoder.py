"""`Decoder`: a `GPT`'s forward for sampling, one step at a time over a KV cache, on the model's
own parameters; the training module (`gpt.py`, `transformer.py`, `attention.py`) keeps only
training's forward.

`decode` continues a growing `KVCache` with the training block's math. `decode_static_hidden`
writes a preallocated `StaticKVCache` at per-row positions (ragged batches, CUDA graphs) and spends
its kernels sparingly, since one step of a small model is bound by kernel count: keys and values
go into the cache straight from the QKV projection's output (one scatter, or rotated on the way by
`kernels.rotary_qkv_into_cache`; for one token per row the rotation, the cache write and the
attention are one kernel, `kernels.rotary.attend_one_token`), grouped keys and values are attended
as they are (each group's queries as rows of one head), the attention mask is built once per step
for every layer (where the one-token kernel does not mask by position itself), each
layer's last residual add is left to the next norm (LayerNorm or RMSNorm, fused into the next
product for one row with the MLP's GeLU or SwiGLU after it: `projections.py`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .. import kernels
from ..attention import ParallelSelfAttention, repeat_kv
from ..gpt import GPT
from ..kernels.rotary import attend_one_token
from ..transformer import ParallelTransformerLayer
from .caches import KVCache, LayerKVCache, StaticKVCache, StaticLayerCache
from .projections import decode_add_norm_linear, decode_linear, decode_lm_head


class Decoder:
    """Inference over `model`'s parameters (shared, not copied: a state dict loaded into the
    model later is what the decoder reads). No dropout: decode an `eval()` model. Needs sequence
    parallelism off (decoding runs on the whole, short sequence)."""

    def __init__(self, model: GPT) -> None:
        if any(layer.sequence_parallel for layer in model.layers):
            raise ValueError("decoding needs a config with sequence_parallel=False")
        self.model = model

    def decode(self, tokens: torch.Tensor, *, cache: KVCache) -> torch.Tensor:
        """tokens (B, S_new) at positions cache.num_positions onwards -> their vocab-parallel
        logits (B, S_new, V/TP); appends their keys and values to cache.

        Start with `KVCache(config.num_layers)` and the whole prompt, then feed one token at a
        time.
        """
        model = self.model
        self._check_num_layers(cache)
        x = model.embedding(tokens, position_offset=cache.num_positions).transpose(0, 1)
        for layer, layer_cache in zip(model.layers, cache.layers, strict=True):
            x = _decode_layer(layer, x, layer_cache)  # (S_new, B, H)
        return self.lm_head(model.final_layernorm(x.transpose(0, 1)))

    def decode_static_hidden(
        self,
        tokens: torch.Tensor,
        *,
        positions: torch.Tensor,
        cache: StaticKVCache,
        output_index: torch.Tensor | None = None,
        num_slots: int | None = None,
    ) -> torch.Tensor:
        """tokens (B, S_new) at per-row positions (B, S_new) -> the final LayerNorm's output
        (B, S_new, H), or (B, 1, H) at each row's `output_index` (B,) when given; `lm_head` makes
        it logits, or the caller applies the tied head its own way.

        Writes the tokens' keys and values into the preallocated cache at slots `positions`;
        each token attends to its row's slots up to its own position. A batch of prompts of
        different lengths is right-padded and prefilled with positions 0..S-1 (padding past a
        row's end is written but never seen), then each step feeds one token per row at that
        row's next position. Shapes never change between steps, so a step can be captured in a
        CUDA graph. Positions must be < cache.max_length (not checked: that would wait on the
        device).

        num_slots: attend to the cache's first num_slots slots only (every position must be
        below it), so a short context does not pay for the whole cache; a new value changes the
        shapes (not for CUDA graphs). None: every slot.
        """
        model = self.model
        self._check_num_layers(cache)
        if tokens.shape[0] != cache.batch_size or positions.shape != tokens.shape:
            raise ValueError(
                f"tokens {tuple(tokens.shape)} and positions {tuple(positions.shape)} must both "
                f"be (batch {cache.batch_size}, S_new)"
            )
        bias = None  # the one-token kernel masks by position itself
        if not _one_token_kernel(model.layers[0].self_attention, tokens.shape[1]):
            bias = cache.attention_bias(positions, num_slots=num_slots)  # (B, 1, S_new, slots)
        x = model.embedding(tokens, positions=positions).transpose(0, 1)  # (S_new, B, H)
        # Each layer's last residual add is left to the next norm (the next layer's input norm,
        # fused into its QKV product for one token per row, or the final norm).
        out, summed = None, x
        for layer, layer_cache in zip(model.layers, cache.layers, strict=True):
            out, summed = _static_layer(
                layer, out, summed, cache=layer_cache, positions=positions, bias=bias
            )
        normed, _ = model.final_layernorm.add_norm(out, summed)
        x = normed.transpose(0, 1)  # (B, S_new, H), final LayerNorm applied
        if output_index is not None:
            x = x[torch.arange(x.shape[0], device=x.device), output_index].unsqueeze(1)
        return x

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head: the final norm's output (B, S, H) -> vocab-parallel logits (B, S, V/TP);
        one row through the skinny kernel where the projections take it (`decode_lm_head`)."""
        return decode_lm_head(self.model, hidden)

    def _check_num_layers(self, cache: KVCache | StaticKVCache) -> None:
        if len(cache.layers) != len(self.model.layers):
            raise ValueError(
                f"the cache has {len(cache.layers)} layers, the model {len(self.model.layers)}"
            )


def _decode_layer(
    layer: ParallelTransformerLayer, x: torch.Tensor, cache: LayerKVCache
) -> torch.Tensor:
    """The layer's block (without dropout) on x (S_new, B, H) at positions cache.num_positions
    onwards; appends their keys and values to cache."""
    attention = layer.self_attention
    q, k, v = attention.project_qkv(layer.input_layernorm(x), position_offset=cache.num_positions)
    k, v = cache.extend(k, v)
    attn = attention.project_out(attention.attend(q, k, v))
    normed, summed = layer.post_attention_layernorm.add_norm(attn, x)  # summed = x + attn
    return summed + layer.mlp(normed)


def _static_layer(
    layer: ParallelTransformerLayer,
    out: torch.Tensor | None,
    residual: torch.Tensor,
    *,
    cache: StaticLayerCache,
    positions: torch.Tensor,
    bias: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer on the static cache without its last add, which the caller leaves to the next
    norm: the layer's input is residual + out (out None: residual alone, the first layer), whose
    add and input norm run inside the QKV product's kernel for one token per row
    (`decode_add_norm_linear`) -> (mlp_out, summed), the layer's output being summed + mlp_out."""
    attention = layer.self_attention
    use_kernel = layer.config.use_fused_kernels
    if out is None:
        normed = layer.input_layernorm(residual)
        qkv = decode_linear(attention.query_key_value, normed, use_kernel=use_kernel)
    else:
        qkv, residual = decode_add_norm_linear(
            layer.input_layernorm, out, residual, attention.query_key_value, use_kernel=use_kernel
        )
    attn = _attend_qkv(attention, qkv, cache=cache, positions=positions, bias=bias)
    return _mlp(layer, attn, residual)


def _mlp(
    layer: ParallelTransformerLayer, attn: torch.Tensor, residual: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mlp_out, summed) after attention: summed = residual + attn, its norm fused into the
    first MLP product where it can be, the GeLU (bias included) or SwiGLU in its epilogue."""
    mlp, gated = layer.mlp, layer.config.gated
    hidden, summed = decode_add_norm_linear(
        layer.post_attention_layernorm,
        attn,
        residual,
        mlp.dense_h_to_4h,
        use_kernel=mlp.use_kernel,
        gelu=not gated,
        swiglu=gated,
        approximate="tanh" if gated else mlp.gelu_approximate,  # unread with swiglu
    )
    return decode_linear(mlp.dense_4h_to_h, hidden, use_kernel=mlp.use_kernel), summed


def _attend_qkv(
    attention: ParallelSelfAttention,
    qkv: torch.Tensor,
    *,
    cache: StaticLayerCache,
    positions: torch.Tensor,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """Attention from the QKV projection's output (S_new, B, qkv_size/TP), per group [its
    queries, key, value]: keys and values go into the cache straight from it (one scatter
    without rotary; rotated on the way by `kernels.rotary_qkv_into_cache` with it). One token
    per row with the kernels is one kernel from qkv to the context (`attend_one_token`)."""
    seq, batch = qkv.shape[:2]
    groups, head_dim = attention.num_local_groups, attention.head_dim
    per_group = attention.num_local_heads // groups
    if _one_token_kernel(attention, seq):
        rotary = attention.rotary
        context = attend_one_token(
            qkv,
            None if rotary is None else rotary.cos,
            None if rotary is None else rotary.sin,
            positions,
            cache.keys,
            cache.values,
            groups=groups,
            per_group=per_group,
            head_dim=head_dim,
            use_kernel=True,
        )  # (1, B, H/TP)
        return decode_linear(attention.dense, context, use_kernel=True)
    if attention.rotary is not None:
        q = kernels.rotary_qkv_into_cache(
            qkv,
            attention.rotary.cos,
            attention.rotary.sin,
            positions,
            cache.keys,
            cache.values,
            groups=groups,
            per_group=per_group,
            head_dim=head_dim,
            use_kernel=attention.config.use_fused_kernels,
        )  # (B, nh, S, hd)
        return _attend_slots(attention, q, cache.keys, cache.values, bias)
    qkv = qkv.view(seq, batch, groups, per_group + 2, head_dim)
    q = qkv[:, :, :, :per_group].reshape(seq, batch, groups * per_group, head_dim)
    keys, values = cache.write_kv(qkv[:, :, :, per_group:].permute(3, 1, 2, 0, 4), positions)
    return _attend_slots(attention, q.permute(1, 2, 0, 3), keys, values, bias)


def _one_token_kernel(attention: ParallelSelfAttention, seq: int) -> bool:
    """Whether a step's attention is `attend_one_token`'s one kernel: one token per row with
    the kernels, causal softmax attention at the default scale (not ALiBi's slopes, not the
    explicit-scores path that the softmax backend asks for)."""
    config = attention.config
    return (
        seq == 1
        and config.use_fused_kernels
        and attention.alibi is None
        and not config.explicit_attention_scores
    )


def _attend_slots(
    attention: ParallelSelfAttention, q, keys, values, bias: torch.Tensor
) -> torch.Tensor:
    """q (B, nh, S_new, hd) over the cache's keys and values, then the output projection;
    `bias` (B, 1, S_new, slots) is `StaticKVCache.attention_bias(positions)`."""
    num_slots = bias.shape[-1]  # the cache's first slots only, when the caller says so
    if num_slots != keys.shape[2]:
        keys, values = keys[:, :, :num_slots], values[:, :, :num_slots]
    context = _masked_attention(attention, q, keys, values, bias)  # (B, nh, S, hd)
    seq, batch = context.shape[2], context.shape[0]
    context = context.permute(2, 0, 1, 3).reshape(seq, batch, -1)  # (S, B, H/TP)
    return decode_linear(attention.dense, context, use_kernel=attention.config.use_fused_kernels)


def _masked_attention(
    attention: ParallelSelfAttention, q, k, v, bias: torch.Tensor
) -> torch.Tensor:
    """Attention of q (B, nh, Sq, hd) over every slot of k, v (B, groups, L, hd), plus the
    additive bias (B, 1, Sq, L). ALiBi's key positions are the slots."""
    q = q.to(k.dtype)
    batch, heads, seq, head_dim = q.shape
    if attention.alibi is not None:  # per-head slopes: a score row per query head
        k, v = repeat_kv(k, heads), repeat_kv(v, heads)
        scores = torch.matmul(q, k.transpose(-1, -2)).float() / math.sqrt(head_dim)
        slots = torch.arange(k.shape[2], device=q.device, dtype=torch.float32)
        scores = scores + attention.alibi.to(q.device).float() * slots
        probs = torch.softmax(scores + bias.float(), dim=-1)
        return torch.matmul(probs.to(v.dtype), v)
    # Grouped-query attention without repeating keys and values over the cache: a group's
    # query heads are rows of one head, (B, groups, per_group * Sq, hd), the mask repeated to
    # match (row p * Sq + s is head p's query s; one query per row broadcasts as it is).
    per_group = heads // k.shape[1]
    q = q.reshape(batch, k.shape[1], per_group * seq, head_dim)
    if per_group > 1 and seq > 1:
        bias = bias.repeat(1, 1, per_group, 1)
    if not attention.config.explicit_attention_scores:
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    else:
        scores = torch.matmul(q, k.transpose(-1, -2)).float() / math.sqrt(head_dim)
        probs = torch.softmax(scores + bias.float(), dim=-1)
        context = torch.matmul(probs.to(v.dtype), v)
    return context.reshape(batch, heads, seq, head_dim)
