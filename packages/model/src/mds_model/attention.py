"""Tensor-parallel causal self-attention (Megatron's `ParallelAttention`) with four core backends.

QKV comes out of one column-parallel linear laid out per partition as `[heads/TP, 3, head_dim]`
(Megatron checkpoint version >= 2), or with grouped-query attention (`num_query_groups`) as
upstream's `[groups/TP, heads/groups + 2, head_dim]`: each group's queries, then its key and value,
which the group's query heads share. The core runs flash-attn's function when importable (CUDA, half
precision), else `scaled_dot_product_attention`, else (ALiBi, or cached queries shorter than keys)
explicit scores through the kernel API's scaled masked softmax. `cudnn` is SDPA with cuDNN's fused
attention first in its order (on CUDA; SDPA's others where cuDNN does not take the input): on an
H100 its forward and backward took 0.68 ms against the flash backend's 0.96 at the 345M shape.
Rotary follows GPT-NeoX's rotate-half over the first `rotary_dim` dimensions of each head
(all of it by default); ALiBi slopes follow Press et al. and
BS, sliced per TP partition. Decoding with a KV cache (`mds_model.decoding`) builds on
`project_qkv`, `attend` and `project_out`.
"""

from __future__ import annotations

import contextlib
import inspect
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from . import kernels
from .config import GPTConfig
from .kernels.rotary import rotate_half_reference
from .layers import ColumnParallelLinear, RowParallelLinear
from .parallel import ParallelGroups
from .rng import RNGStatesTracker, checkpoint

try:  # optional dependency: only used on CUDA with fp16/bf16
    from flash_attn import flash_attn_func
except ImportError:  # pragma: no cover - depends on the machine
    flash_attn_func = None


# SDPA's backends in the order the `cudnn` backend tries them: cuDNN's fused attention, then SDPA's
# own order for what cuDNN does not take.
CUDNN_FIRST = [
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.MATH,
]
SDPA_TAKES_PRIORITY = "set_priority" in inspect.signature(sdpa_kernel).parameters


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
    """cos/sin tables for rotary positions over a head's first `dim` dimensions (the rest pass
    through: upstream's --rotary-percent, GPT-NeoX's rotary_pct); not saved in checkpoints."""

    def __init__(self, dim: int, *, max_positions: int, base: float) -> None:
        super().__init__()
        self.dim = dim
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)  # (max_positions, dim)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, x: torch.Tensor, offset: int) -> torch.Tensor:
        # x: (B, heads, S, head_dim)
        seq = x.shape[2]
        cos = self.cos[offset : offset + seq].to(x.dtype)
        sin = self.sin[offset : offset + seq].to(x.dtype)
        return rotate_half_reference(x, cos, sin)

    def at(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x (B, heads, S, head_dim) rotated by per-row positions (B, S)."""
        cos = self.cos[positions].unsqueeze(1).to(x.dtype)  # (B, 1, S, dim)
        sin = self.sin[positions].unsqueeze(1).to(x.dtype)
        return rotate_half_reference(x, cos, sin)


def repeat_kv(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Keys or values of the key/value groups (B, groups, S, hd) -> one per query head (B, heads,
    S, hd): head i reads group i // (heads / groups), as upstream's and transformers' repeat_kv."""
    groups = x.shape[1]
    if groups == num_heads:
        return x
    return x.repeat_interleave(num_heads // groups, dim=1)


class ParallelSelfAttention(nn.Module):
    """Causal self-attention; hidden states are Megatron's (S, B, H), heads split over TP ranks."""

    def __init__(
        self, config: GPTConfig, *, groups: ParallelGroups, rng_tracker: RNGStatesTracker | None
    ) -> None:
        super().__init__()
        h, dtype = config.hidden_size, config.torch_dtype
        self.config, self.groups, self.rng_tracker = config, groups, rng_tracker
        self.num_local_heads = config.num_attention_heads // groups.tp_size
        self.num_local_groups = config.query_groups // groups.tp_size
        self.head_dim = config.head_dim
        sequence_parallel = config.sequence_parallel
        self.query_key_value = ColumnParallelLinear(
            h,
            config.qkv_size,
            groups=groups,
            init_std=config.init_method_std,
            bias=config.add_bias_linear,
            sequence_parallel=sequence_parallel,
            dtype=dtype,
        )
        self.dense = RowParallelLinear(
            h,
            h,
            groups=groups,
            init_std=config.output_layer_init_std,
            bias=config.add_bias_linear,
            sequence_parallel=sequence_parallel,
            dtype=dtype,
        )
        self.rotary = None
        if config.rotary_positions:
            self.rotary = RotaryEmbedding(
                config.rotary_dim, max_positions=config.max_positions, base=config.rotary_base
            )
        self.alibi: torch.Tensor | None = None
        if config.alibi_positions:
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
        if backend == "cudnn" and not SDPA_TAKES_PRIORITY:
            raise ValueError(
                "attention_backend 'cudnn' needs torch's sdpa_kernel(set_priority=...), which "
                f"torch {torch.__version__} lacks; upgrade torch"
            )
        self.backend = backend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (S, B, H) [or its (S/TP, B, H) sequence-parallel slice] -> the same shape."""
        q, k, v = self.project_qkv(x)
        if self.config.activation_checkpointing == "selective" and self.training:
            context = checkpoint(self.attend, q, k, v, rng_tracker=self.rng_tracker)
        else:
            context = self.attend(q, k, v)
        return self.project_out(context)

    def project_qkv(
        self, x: torch.Tensor, *, position_offset: int = 0, positions: torch.Tensor | None = None
    ):
        """x (S, B, H) -> queries (B, heads/TP, S, hd), keys and values (B, groups/TP, S, hd)
        (groups: heads without grouped-query attention), rotated when rotary: at positions
        position_offset onwards, or at per-row positions (B, S)."""
        qkv = self.query_key_value(x)  # (S, B, qkv_size/TP), per group [queries, key, value]
        seq, batch = qkv.shape[:2]  # the whole sequence, also when x is a sequence-parallel slice
        per_group = self.num_local_heads // self.num_local_groups
        if self.rotary is not None and positions is None and position_offset == 0:
            # training's (and a whole sequence's) split and rotation: one fused pass each way
            return kernels.rotary_qkv(
                qkv,
                self.rotary.cos,
                self.rotary.sin,
                groups=self.num_local_groups,
                per_group=per_group,
                head_dim=self.head_dim,
                use_kernel=self.config.use_fused_kernels,
            )
        qkv = qkv.view(seq, batch, self.num_local_groups, per_group + 2, self.head_dim)
        if per_group == 1:
            # unbind, not three index ops: its backward writes one stacked gradient instead of
            # three zero-filled full-size ones.
            q, k, v = (t.permute(1, 2, 0, 3) for t in qkv.unbind(dim=3))  # each (B, nh, S, hd)
        else:
            q, k, v = qkv.split([per_group, 1, 1], dim=3)
            q = q.reshape(seq, batch, self.num_local_heads, self.head_dim).permute(1, 2, 0, 3)
            k, v = (t.squeeze(3).permute(1, 2, 0, 3) for t in (k, v))  # (B, ng, S, hd)
        if self.rotary is not None and positions is not None:
            q, k = self.rotary.at(q, positions), self.rotary.at(k, positions)
        elif self.rotary is not None:
            q, k = self.rotary(q, position_offset), self.rotary(k, position_offset)
        return q, k, v

    def project_out(self, context: torch.Tensor) -> torch.Tensor:
        """context (B, heads/TP, S, hd) -> the output projection (S, B, H), reduced over TP."""
        seq, batch = context.shape[2], context.shape[0]
        context = context.permute(2, 0, 1, 3).reshape(seq, batch, -1)  # (S, B, H/TP)
        return self.dense(context)

    def _dropout_rng(self, p: float):
        """The TP-rank RNG state for dropout; none without dropout, which draws nothing (saving and
        restoring the generators' states costs about 50 us of host time per call)."""
        if p == 0.0 or self.rng_tracker is None:
            return contextlib.nullcontext()
        return self.rng_tracker.fork()

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """softmax(q k^T / sqrt(d) + causal mask [+ ALiBi]) v.

        q (B, nh, Sq, hd), k and v (B, nh or groups, Sk, hd) -> (B, nh, Sq, hd).
        """
        p = self.config.attention_dropout if self.training else 0.0
        sq, sk = q.shape[2], k.shape[2]
        backend = self.backend
        if self.config.explicit_attention_scores or (sq != sk and sq > 1):
            backend = "softmax"  # masks SDPA's is_causal cannot express (it aligns top-left)
        if backend == "flash" and not (q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)):
            backend = "sdpa"
        if backend == "cudnn" and not q.is_cuda:
            backend = "sdpa"
        # flash-attn and SDPA (enable_gqa) take grouped keys and values as they are
        grouped = k.shape[1] != q.shape[1]
        with self._dropout_rng(p):  # dropout on TP-split heads must differ per rank
            if backend == "flash":
                out = flash_attn_func(
                    *(t.transpose(1, 2) for t in (q, k, v)), dropout_p=p, causal=True
                )
                return out.transpose(1, 2)
            causal = sq > 1
            if backend == "sdpa":
                return F.scaled_dot_product_attention(
                    q, k, v, dropout_p=p, is_causal=causal, enable_gqa=grouped
                )
            if backend == "cudnn":
                with sdpa_kernel(CUDNN_FIRST, set_priority=True):
                    return F.scaled_dot_product_attention(
                        q, k, v, dropout_p=p, is_causal=causal, enable_gqa=grouped
                    )
            k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])
            return self._softmax_core(q, k, v, p)

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
