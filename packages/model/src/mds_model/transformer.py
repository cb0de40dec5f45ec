"""One pre-LayerNorm GPT block with Megatron-DeepSpeed's names (`ParallelTransformerLayer`).

Names inside a layer are those of Megatron-DeepSpeed's `layer_XX-model_YY-model_states.pt` files:
input_layernorm, self_attention.{query_key_value,dense}, post_attention_layernorm,
mlp.{dense_h_to_4h,dense_4h_to_h}. The residual add before the second norm and the MLP's
activation (bias+GeLU, or SwiGLU) go through the kernel API (fused in Triton, or their pure-torch
references). The config chooses the norm (`layers.norm_for`) and the MLP (`mlp_for`).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from . import kernels
from .attention import ParallelSelfAttention
from .config import GPTConfig
from .layers import ColumnParallelLinear, RowParallelLinear, norm_for
from .parallel import ParallelGroups
from .rng import RNGStatesTracker, checkpoint, init_rng


class ParallelMLP(nn.Module):
    """h -> ffn (column-parallel) -> activation -> h (row-parallel). GeLU with the first bias
    kept apart for the fused bias+GeLU (`GeluMLP`) or SwiGLU over [gate; up] (`SwiGLUMLP`)."""

    gated = False

    def __init__(self, config: GPTConfig, *, groups: ParallelGroups) -> None:
        super().__init__()
        self.use_kernel = config.use_fused_kernels
        self.dense_h_to_4h = ColumnParallelLinear(
            config.hidden_size,
            2 * config.ffn_size if self.gated else config.ffn_size,
            groups=groups,
            init_std=config.init_method_std,
            bias=config.add_bias_linear,
            skip_bias_add=not self.gated,
            sequence_parallel=config.sequence_parallel,
            dtype=config.torch_dtype,
            gated=self.gated,
        )
        self.dense_4h_to_h = RowParallelLinear(
            config.ffn_size,
            config.hidden_size,
            groups=groups,
            init_std=config.output_layer_init_std,
            bias=config.add_bias_linear,
            sequence_parallel=config.sequence_parallel,
            dtype=config.torch_dtype,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.activation(self.dense_h_to_4h(x))  # (S, B, ffn/TP)
        return self.dense_4h_to_h(y)  # (S, B, H), reduced over TP

    def activation(self, y: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class GeluMLP(ParallelMLP):
    """GPT-2's: gelu(x A + b), the bias added inside the fused bias+GeLU."""

    def __init__(self, config: GPTConfig, *, groups: ParallelGroups) -> None:
        super().__init__(config, groups=groups)
        self.gelu_approximate = config.gelu_approximate

    def activation(self, y: torch.Tensor) -> torch.Tensor:
        bias = self.dense_h_to_4h.bias
        if bias is None:  # --disable-bias-linear
            return F.gelu(y, approximate=self.gelu_approximate)
        return kernels.bias_gelu(
            y, bias, approximate=self.gelu_approximate, use_kernel=self.use_kernel
        )


class SwiGLUMLP(ParallelMLP):
    """Llama's: silu(gate) * up over this rank's [gate_r; up_r] (upstream's --swiglu)."""

    gated = True

    def activation(self, y: torch.Tensor) -> torch.Tensor:
        return kernels.swiglu(y, use_kernel=self.use_kernel)


def mlp_for(config: GPTConfig, *, groups: ParallelGroups) -> ParallelMLP:
    """The config's MLP: the one place it is chosen."""
    return (SwiGLUMLP if config.gated else GeluMLP)(config, groups=groups)


class ParallelTransformerLayer(nn.Module):
    """x + attn(LN(x)), then + mlp(LN(.)); hidden states (S, B, H) as in Megatron."""

    def __init__(
        self,
        config: GPTConfig,
        *,
        groups: ParallelGroups,
        rng_tracker: RNGStatesTracker | None,
        layer_number: int,
        init_seed: int | None = None,
    ) -> None:
        """layer_number counts from 1 as in Megatron; init_seed + layer_number seeds the weights."""
        super().__init__()
        self.config, self.groups, self.rng_tracker = config, groups, rng_tracker
        self.layer_number = layer_number
        # With sequence parallelism the LayerNorms and the dropouts see this rank's slice of S.
        self.sequence_parallel = config.sequence_parallel
        layer_norm = functools.partial(
            norm_for,
            config,
            sequence_parallel_group=groups.tp_group if self.sequence_parallel else None,
        )
        with init_rng(None if init_seed is None else init_seed + layer_number):
            self.input_layernorm = layer_norm()
            self.self_attention = ParallelSelfAttention(
                config, groups=groups, rng_tracker=rng_tracker
            )
            self.post_attention_layernorm = layer_norm()
            self.mlp = mlp_for(config, groups=groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (S, B, H) [or its (S/TP, B, H) sequence-parallel slice] -> the same shape."""
        if self.config.activation_checkpointing == "full" and self.training:
            return checkpoint(self._block, x, rng_tracker=self.rng_tracker)
        return self._block(x)

    def _block(self, x: torch.Tensor) -> torch.Tensor:
        p = self.config.hidden_dropout if self.training else 0.0
        normed, residual = self.input_layernorm.norm_and_residual(x)  # residual: x
        attn = self._dropout(self.self_attention(normed), p)
        normed, summed = self.post_attention_layernorm.add_norm(attn, residual)  # x + attn
        out = self._dropout(self.mlp(normed), p)
        return summed + out

    def _dropout(self, x: torch.Tensor, p: float) -> torch.Tensor:
        if p == 0.0:
            return x
        if self.sequence_parallel and self.rng_tracker is not None:
            with self.rng_tracker.fork():  # each rank holds other tokens: masks must differ
                return F.dropout(x, p=p)
        # Replicated activations: the default generator, identical on TP ranks.
        return F.dropout(x, p=p)
