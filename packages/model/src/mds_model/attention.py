"""Tensor-parallel causal self-attention (Megatron's `ParallelAttention`) with three core backends.

QKV comes out of one column-parallel linear laid out per partition as `[heads/TP, 3, head_dim]`
(Megatron checkpoint version >= 2). The core runs flash-attn's function when importable (CUDA, half
precision), else `scaled_dot_product_attention`, else (ALiBi, or cached queries shorter than keys)
explicit scores through the kernel API's scaled masked softmax. Rotary follows GPT-NeoX's
rotate-half over the whole head; ALiBi slopes follow Press et al. and BS, sliced per TP partition.
Two decoding caches: `KVCache` grows by concatenation, `StaticKVCache` is preallocated with
per-row positions (ragged batches, CUDA graphs).
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from . import kernels
from .config import GPTConfig
from .layers import ColumnParallelLinear, RowParallelLinear, decode_linear
from .parallel import ParallelGroups
from .rng import RNGStatesTracker, checkpoint

try:  # optional dependency: only used on CUDA with fp16/bf16
    from flash_attn import flash_attn_func
except ImportError:  # pragma: no cover - depends on the machine
    flash_attn_func = None


class LayerKVCache:
    """One layer's keys and values of the positions decoded so far, each (B, heads/TP, S, hd)."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    @property
    def num_positions(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def extend(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Appends the new positions' keys and values; returns all of them, past and new."""
        if self.keys is not None:
            keys = torch.cat((self.keys, keys), dim=2)
            values = torch.cat((self.values, values), dim=2)
        self.keys, self.values = keys, values
        return keys, values


class KVCache:
    """The whole model's cache for `GPT.decode`: one `LayerKVCache` per transformer layer.

    Starts empty; each decode call appends its tokens' keys and values, and the next call's
    positions continue at `num_positions`.
    """

    def __init__(self, num_layers: int) -> None:
        self.layers = [LayerKVCache() for _ in range(num_layers)]

    @property
    def num_positions(self) -> int:
        return self.layers[0].num_positions if self.layers else 0


class StaticLayerCache:
    """One layer's preallocated keys and values, `kv` (2, B, heads/TP, max_length, head_dim);
    `keys` and `values` are its two halves.

    Row b's token at position p lives in slot p (per-row positions, no left padding): a batch
    of prompts of different lengths is right-padded, and each row writes and reads its own slots.
    Writes are in place (shapes never change: CUDA graphs can replay them).
    """

    def __init__(self, kv: torch.Tensor) -> None:
        self.kv = kv
        self.keys, self.values = kv[0], kv[1]

    def write(
        self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Stores keys, values (B, nh, S_new, hd) at the slots `positions` (B, S_new); returns the
        whole keys and values (B, nh, max_length, hd)."""
        return self.write_kv(torch.stack((keys, values)), positions)

    def write_kv(
        self, kv: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`write` of keys and values stacked as kv (2, B, nh, S_new, hd) (any strides, such as a
        view of the QKV projection): one scatter for both."""
        index = positions[None, :, None, :, None].expand_as(kv)
        self.kv.scatter_(3, index, kv.to(self.kv.dtype))
        return self.keys, self.values


class StaticKVCache:
    """The whole model's preallocated cache for `GPT.decode_static`: one `StaticLayerCache` per
    layer, `batch_size` rows of `max_length` positions, allocated once (a fixed memory address
    for CUDA graphs and torch.compile).

    A query at position p sees the slots 0..p of its row (`visibility`): slots past a row's
    prompt hold padding or the last call's tokens until that row writes them, and are never
    read before.
    """

    def __init__(
        self,
        config: GPTConfig,
        *,
        batch_size: int,
        max_length: int,
        tensor_parallel_size: int = 1,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        if not 1 <= max_length <= config.max_positions:
            raise ValueError(
                f"max_length must be in 1..{config.max_positions} (max_position_embeddings), "
                f"got {max_length}"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        shape = (
            2,
            batch_size,
            config.num_attention_heads // tensor_parallel_size,
            max_length,
            config.head_dim,
        )
        dtype = dtype or config.torch_dtype
        self.batch_size, self.max_length, self.dtype = batch_size, max_length, dtype
        self.layers = [
            StaticLayerCache(torch.zeros(shape, device=device, dtype=dtype))
            for _ in range(config.num_layers)
        ]
        self._slots = torch.arange(max_length, device=device)

    def visibility(self, positions: torch.Tensor, *, num_slots: int | None = None) -> torch.Tensor:
        """positions (B, S_new) -> attention mask (B, 1, S_new, num_slots or max_length):
        slot <= position."""
        slots = self._slots if num_slots is None else self._slots[:num_slots]
        return slots.view(1, 1, 1, -1) <= positions[:, None, :, None]

    def attention_bias(
        self, positions: torch.Tensor, *, num_slots: int | None = None
    ) -> torch.Tensor:
        """`visibility` as an additive mask in the cache's dtype (0 where seen, -inf elsewhere),
        built once per step for every layer (a boolean mask is converted again by each call).
        Its last dimension says how many slots the attention reads (`GPT.decode_static_hidden`'s
        num_slots)."""
        if num_slots is not None and not 1 <= num_slots <= self.max_length:
            raise ValueError(f"num_slots must be in 1..{self.max_length}, got {num_slots}")
        visible = self.visibility(positions, num_slots=num_slots)
        bias = torch.zeros(visible.shape, dtype=self.dtype, device=positions.device)
        return bias.masked_fill_(~visible, float("-inf"))


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """Per-head slopes 2^(-8i/n); for n not a power of two, Press et al.'s interleaved extension."""

    def power_of_2(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(num_heads).is_integer():
        return torch.tensor(power_of_2(num_heads))
    closest = 2 ** math.floor(math.log2(num_heads))
    extra = power_of_2(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(power_of_2(closest) + extra)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for rotary positions; not saved in checkpoints (derived from the config)."""

    def __init__(self, head_dim: int, *, max_positions: int, base: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)  # (max_positions, head_dim)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, x: torch.Tensor, offset: int) -> torch.Tensor:
        # x: (B, heads, S, head_dim)
        seq = x.shape[2]
        cos = self.cos[offset : offset + seq].to(x.dtype)
        sin = self.sin[offset : offset + seq].to(x.dtype)
        return self._rotate(x, cos, sin)

    def at(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x (B, heads, S, head_dim) rotated by per-row positions (B, S)."""
        cos = self.cos[positions].unsqueeze(1).to(x.dtype)  # (B, 1, S, head_dim)
        sin = self.sin[positions].unsqueeze(1).to(x.dtype)
        return self._rotate(x, cos, sin)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin


class ParallelSelfAttention(nn.Module):
    """Causal self-attention; hidden states are Megatron's (S, B, H), heads split over TP ranks."""

    def __init__(
        self, config: GPTConfig, *, groups: ParallelGroups, rng_tracker: RNGStatesTracker | None
    ) -> None:
        super().__init__()
        h, dtype = config.hidden_size, config.torch_dtype
        self.config, self.groups, self.rng_tracker = config, groups, rng_tracker
        self.num_local_heads = config.num_attention_heads // groups.tp_size
        self.head_dim = config.head_dim
        sequence_parallel = config.sequence_parallel_active
        self.query_key_value = ColumnParallelLinear(
            h,
            3 * h,
            groups=groups,
            init_std=config.init_method_std,
            sequence_parallel=sequence_parallel,
            dtype=dtype,
        )
        self.dense = RowParallelLinear(
            h,
            h,
            groups=groups,
            init_std=config.output_layer_init_std,
            sequence_parallel=sequence_parallel,
            dtype=dtype,
        )
        self.rotary = None
        if config.position_embedding_type == "rotary":
            self.rotary = RotaryEmbedding(
                self.head_dim, max_positions=config.max_positions, base=config.rotary_base
            )
        self.alibi: torch.Tensor | None = None
        if config.position_embedding_type == "alibi":
            start = groups.tp_rank * self.num_local_heads
            slopes = alibi_slopes(config.num_attention_heads)[start : start + self.num_local_heads]
            del self.alibi  # a plain attribute cannot become a buffer of the same name
            self.register_buffer("alibi", slopes.view(-1, 1, 1), persistent=False)
        backend = config.attention_backend
        if backend == "auto":
            backend = "flash" if flash_attn_func is not None else "sdpa"
        if backend == "flash" and flash_attn_func is None:
            raise ValueError(
                "attention_backend 'flash' needs the flash-attn package; pip install flash-attn"
            )
        self.backend = backend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (S, B, H) [or its (S/TP, B, H) sequence-parallel slice] -> the same shape."""
        q, k, v = self._qkv(x, position_offset=0)
        if self.config.activation_checkpointing == "selective" and self.training:
            context = checkpoint(self._core, q, k, v, rng_tracker=self.rng_tracker)
        else:
            context = self._core(q, k, v)
        return self._project(context)

    def decode(self, x: torch.Tensor, *, cache: LayerKVCache) -> torch.Tensor:
        """x (S_new, B, H) at positions cache.num_positions onwards -> (S_new, B, H); the new
        keys and values are appended to cache."""
        q, k, v = self._qkv(x, position_offset=cache.num_positions)
        k, v = cache.extend(k, v)
        return self._project(self._core(q, k, v))

    def decode_static(
        self,
        x: torch.Tensor,
        *,
        cache: StaticLayerCache,
        positions: torch.Tensor,
        bias: torch.Tensor,
    ) -> torch.Tensor:
        """x (S_new, B, H) of tokens at per-row positions (B, S_new) -> (S_new, B, H).

        Their keys and values go into cache's slots `positions`; `bias` (B, 1, S_new, slots) is
        `StaticKVCache.attention_bias(positions)`, computed once per step for every layer.
        """
        if self.rotary is not None:
            q, k, v = self._qkv(x, position_offset=0, positions=positions)
            keys, values = cache.write(k, v, positions)
            return self._decode_attend(q, keys, values, bias)
        qkv = decode_linear(self.query_key_value, x, use_kernel=self.config.use_fused_kernels)
        return self.decode_static_qkv(qkv, cache=cache, positions=positions, bias=bias)

    def decode_static_qkv(
        self,
        qkv: torch.Tensor,
        *,
        cache: StaticLayerCache,
        positions: torch.Tensor,
        bias: torch.Tensor,
    ) -> torch.Tensor:
        """`decode_static` from the QKV projection's output (S_new, B, 3H/TP), for a caller that
        ran the projection itself (fused with the LayerNorm before it). Not with rotary."""
        if self.rotary is not None:
            raise ValueError("decode_static_qkv: rotary embeddings need decode_static")
        # Keys and values straight from the projection's output: one scatter, no copy.
        seq, batch = qkv.shape[:2]
        qkv = qkv.view(seq, batch, self.num_local_heads, 3, self.head_dim)
        q = qkv[:, :, :, 0].permute(1, 2, 0, 3)  # (B, nh, S, hd)
        keys, values = cache.write_kv(qkv[:, :, :, 1:].permute(3, 1, 2, 0, 4), positions)
        return self._decode_attend(q, keys, values, bias)

    def _decode_attend(self, q, keys, values, bias: torch.Tensor) -> torch.Tensor:
        """q (B, nh, S_new, hd) over the cache's keys and values, then the output projection."""
        num_slots = bias.shape[-1]  # the cache's first slots only, when the caller says so
        if num_slots != keys.shape[2]:
            keys, values = keys[:, :, :num_slots], values[:, :, :num_slots]
        context = self._masked_core(q, keys, values, bias)  # (B, nh, S, hd)
        seq, batch = context.shape[2], context.shape[0]
        context = context.permute(2, 0, 1, 3).reshape(seq, batch, -1)  # (S, B, H/TP)
        return decode_linear(self.dense, context, use_kernel=self.config.use_fused_kernels)

    def _qkv(self, x: torch.Tensor, *, position_offset: int, positions=None):
        """Queries, keys and values (B, heads/TP, S, hd) each, rotated when rotary."""
        qkv = self.query_key_value(x)  # (S, B, 3H/TP) as [heads/TP, 3, head_dim] per position
        seq, batch = qkv.shape[:2]  # the whole sequence, also when x is a sequence-parallel slice
        qkv = qkv.view(seq, batch, self.num_local_heads, 3, self.head_dim)
        # unbind, not three index ops: its backward writes one stacked gradient instead of three
        # zero-filled full-size ones.
        q, k, v = (t.permute(1, 2, 0, 3) for t in qkv.unbind(dim=3))  # each (B, nh, S, hd)
        if self.rotary is not None and positions is not None:
            q, k = self.rotary.at(q, positions), self.rotary.at(k, positions)
        elif self.rotary is not None:
            q, k = self.rotary(q, position_offset), self.rotary(k, position_offset)
        return q, k, v

    def _project(self, context: torch.Tensor) -> torch.Tensor:
        seq, batch = context.shape[2], context.shape[0]
        context = context.permute(2, 0, 1, 3).reshape(seq, batch, -1)  # (S, B, H/TP)
        return self.dense(context)

    def _dropout_rng(self, p: float):
        """The TP-rank RNG state for dropout; none without dropout, which draws nothing (saving and
        restoring the generators' states costs about 50 us of host time per call)."""
        if p == 0.0 or self.rng_tracker is None:
            return contextlib.nullcontext()
        return self.rng_tracker.fork()

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """softmax(q k^T / sqrt(d) + causal mask [+ ALiBi]) v.

        q (B, nh, Sq, hd), k and v (B, nh, Sk, hd) -> (B, nh, Sq, hd).
        """
        p = self.config.attention_dropout if self.training else 0.0
        sq, sk = q.shape[2], k.shape[2]
        backend = self.backend
        if self.config.explicit_attention_scores or (sq != sk and sq > 1):
            backend = "softmax"  # masks SDPA's is_causal cannot express (it aligns top-left)
        if backend == "flash" and not (q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)):
            backend = "sdpa"
        with self._dropout_rng(p):  # dropout on TP-split heads must differ per rank
            if backend == "flash":
                out = flash_attn_func(
                    *(t.transpose(1, 2) for t in (q, k, v)), dropout_p=p, causal=True
                )
                return out.transpose(1, 2)
            if backend == "sdpa":
                return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=sq > 1)
            return self._softmax_core(q, k, v, p)

    def _masked_core(self, q, k, v, bias: torch.Tensor) -> torch.Tensor:
        """Attention of q (B, nh, Sq, hd) over every slot of k, v (B, nh, L, hd), plus the
        additive bias (B, 1, Sq, L); inference only (no dropout). ALiBi's key positions are the
        slots."""
        q = q.to(k.dtype)
        if self.alibi is None and not self.config.explicit_attention_scores:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        scores = torch.matmul(q, k.transpose(-1, -2)).float() / math.sqrt(self.head_dim)
        if self.alibi is not None:
            slots = torch.arange(k.shape[2], device=q.device, dtype=torch.float32)
            scores = scores + self.alibi.to(q.device).float() * slots
        probs = torch.softmax(scores + bias.float(), dim=-1)
        return torch.matmul(probs.to(v.dtype), v)

    def _softmax_core(self, q, k, v, p: float) -> torch.Tensor:
        scale = 1.0 / math.sqrt(self.head_dim)
        scores = torch.matmul(q, k.transpose(-1, -2))  # (B, nh, Sq, Sk)
        if self.alibi is not None:
            # BS adds slope * key_position; the per-row constant it omits cancels in the softmax.
            positions = torch.arange(k.shape[2], device=q.device, dtype=torch.float32)
            bias = (self.alibi.to(q.device) * positions).to(scores.dtype)  # (nh, 1, Sk)
            scores = scores * scale + bias
            scale = 1.0
        probs = kernels.scaled_masked_softmax(
            scores, scale=scale, causal=True, use_kernel=self.config.use_fused_kernels
        )
        if p > 0.0:
            probs = F.dropout(probs, p=p)
        return torch.matmul(probs, v)
