"""Tensor-parallel layers: vocab-parallel embedding, column- and row-parallel linears (Megatron
`mpu/layers.py`).

Weights are initialised as Megatron's `_initialize_affine_weight_cpu`: the full master weight is
drawn on CPU in fp32 from the default generator (seeded alike on every TP rank) and this rank
keeps its slice, so a model built with the same seed is the same model at any TP size. Split
parameters carry Megatron's `tensor_model_parallel`, `partition_dim` and `partition_stride`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from . import kernels
from .config import GPTConfig
from .fp8.linear import Fp8Slot, fp8_linear
from .parallel import (
    ParallelGroups,
    copy_to_tensor_parallel,
    gather_from_sequence_parallel,
    gather_from_tensor_parallel,
    reduce_from_tensor_parallel,
    reduce_scatter_to_sequence_parallel,
    scatter_to_tensor_parallel,
)
from .parameters import GATED, ROWS, Split


def _master_slice(
    shape: tuple[int, ...],
    *,
    std: float,
    partition_dim: int,
    groups: ParallelGroups,
    dtype: torch.dtype,
    split: Split | None = None,
) -> torch.Tensor:
    """This rank's blocks of a seeded master (`split`: a GATED weight's two halves' blocks;
    by default one contiguous block on partition_dim)."""
    master = torch.empty(shape, dtype=torch.float32)
    nn.init.normal_(master, mean=0.0, std=std)
    split = split or Split(ROWS)
    blocks = split.rank_blocks(shape[partition_dim], groups.tp_size, groups.tp_rank)
    parts = [master.narrow(partition_dim, start, stop - start) for start, stop in blocks]
    return torch.cat(parts, dim=partition_dim).to(dtype).contiguous()


def _mark_parallel(param: nn.Parameter, partition_dim: int) -> nn.Parameter:
    param.tensor_model_parallel = True
    param.partition_dim = partition_dim
    param.partition_stride = 1
    return param


class _Linear(nn.Module):
    """The matmul both parallel linears share: F.linear, or its FP8 form once `enable_fp8` has
    given the layer a slot of the model's scaling state."""

    fp8: Fp8Slot | None = None

    def _linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.fp8 is None:
            return F.linear(x, self.weight, bias)
        return fp8_linear(x, self.weight, bias, self.fp8, record=self.training)


def sequence_parallel_param(param: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """A replicated parameter used on this rank's sequence slice: its gradient is summed over TP.

    Identity forward, all-reduce backward (Megatron all-reduces these `sequence_parallel` grads
    in the optimizer instead); None: the parameter itself.
    """
    return param if group is None else copy_to_tensor_parallel(param, group)


class _Norm(nn.Module):
    """A norm over the last dimension: `forward(x)` returns the normed tensor, `add_norm(x,
    residual)` fuses the residual add before it (Megatron's separate add, then the norm), and
    `norm_and_residual(x)` passes x on for a later add. Subclasses say which kernel (`_normalize`).

    sequence_parallel_group: set when the input is a sequence-parallel slice (its grads are summed).
    """

    def __init__(
        self,
        hidden_size: int,
        *,
        eps: float,
        use_kernel: bool,
        dtype: torch.dtype = torch.float32,
        sequence_parallel_group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__()
        self.eps, self.use_kernel = eps, use_kernel
        self.sequence_parallel_group = sequence_parallel_group
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
        if sequence_parallel_group is not None:
            self.weight.sequence_parallel = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., H) -> the normed x, in x's dtype."""
        normed, _ = self._normalize(x, None)
        return normed

    def norm_and_residual(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x), x) for a block that adds x back later: with the kernel the second is a
        view of x whose gradient the norm's backward adds into x's in the same pass, instead of
        autograd adding the two afterwards (an add over the activations per layer)."""
        return self._normalize(x, None)

    def add_norm(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(normed, summed): summed = x + residual (the next residual), normed = norm(summed).

        Under autocast the residual stream (fp32) meets half-precision matmul outputs: both are
        promoted to the wider dtype, as torch's `+` would.
        """
        dtype = torch.promote_types(x.dtype, residual.dtype)
        return self._normalize(x.to(dtype), residual.to(dtype))

    def _normalize(self, x: torch.Tensor, residual: torch.Tensor | None):
        raise NotImplementedError

    def _param(self, param: torch.Tensor) -> torch.Tensor:
        return sequence_parallel_param(param, self.sequence_parallel_group)


class LayerNorm(_Norm):
    """LayerNorm with a weight and a bias (GPT-2's, Megatron's default)."""

    def __init__(self, hidden_size: int, **kwargs) -> None:
        super().__init__(hidden_size, **kwargs)
        self.bias = nn.Parameter(torch.zeros_like(self.weight))
        if self.sequence_parallel_group is not None:
            self.bias.sequence_parallel = True

    def _normalize(self, x: torch.Tensor, residual: torch.Tensor | None):
        return kernels.add_layer_norm(
            x,
            self._param(self.weight),
            self._param(self.bias),
            eps=self.eps,
            residual=residual,
            use_kernel=self.use_kernel,
        )


class RMSNorm(_Norm):
    """RMSNorm with a weight and no bias (Llama's; upstream's `--normalization rmsnorm`),
    statistics in fp32 (kernels.add_rms_norm)."""

    def _normalize(self, x: torch.Tensor, residual: torch.Tensor | None):
        return kernels.add_rms_norm(
            x, self._param(self.weight), eps=self.eps, residual=residual, use_kernel=self.use_kernel
        )


# GPTConfig.normalization -> the module: the one place a layer's norms are chosen.
NORMS = {"layernorm": LayerNorm, "rmsnorm": RMSNorm}


def norm_for(config: GPTConfig, **kwargs) -> _Norm:
    """The config's norm over its hidden size (`sequence_parallel_group` as the caller says)."""
    return NORMS[config.normalization](
        config.hidden_size,
        eps=config.layernorm_epsilon,
        use_kernel=config.use_fused_kernels,
        dtype=config.torch_dtype,
        **kwargs,
    )


class VocabParallelEmbedding(nn.Module):
    """Embedding whose rows (the padded vocabulary) are split in contiguous ranges over TP ranks.

    With `norm` (BLOOM's LayerNorm on the embeddings) the looked-up vectors go through it, named
    `word_embeddings.norm` as BS Megatron-DeepSpeed checkpoints name it.
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        *,
        groups: ParallelGroups,
        init_std: float,
        dtype: torch.dtype = torch.float32,
        norm: LayerNorm | None = None,
    ) -> None:
        super().__init__()
        if num_embeddings % groups.tp_size:
            raise ValueError(
                f"vocabulary size {num_embeddings} is not divisible by {groups.tp_size}"
            )
        self.groups = groups
        self.num_embeddings = num_embeddings
        self.num_local = num_embeddings // groups.tp_size
        self.vocab_start_index = groups.tp_rank * self.num_local
        self.weight = _mark_parallel(
            nn.Parameter(
                _master_slice(
                    (num_embeddings, embedding_dim),
                    std=init_std,
                    partition_dim=0,
                    groups=groups,
                    dtype=dtype,
                )
            ),
            0,
        )
        self.norm = norm

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out = self._lookup(tokens)
        return out if self.norm is None else self.norm(out)

    def _lookup(self, tokens: torch.Tensor) -> torch.Tensor:
        self._check_ids(tokens)
        if self.groups.tp_size == 1:
            return F.embedding(tokens, self.weight)
        # Ids outside this rank's range look up row 0 and are zeroed; the all-reduce fills them in.
        local = tokens - self.vocab_start_index
        outside = (local < 0) | (local >= self.num_local)
        local = local.masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_tensor_parallel(out, self.groups.tp_group)

    def _check_ids(self, tokens: torch.Tensor) -> None:
        """At TP > 1 an id past the (padded) vocabulary would silently embed as zeros; fail instead.
        On a GPU the check is asynchronous, so the training step never waits on the host for it."""
        in_range = ((tokens >= 0) & (tokens < self.num_embeddings)).all()
        if tokens.is_cuda or torch.compiler.is_compiling():  # no host branch in a traced graph
            torch._assert_async(in_range)
        elif not in_range:
            raise ValueError(
                f"token ids {int(tokens.min())}..{int(tokens.max())} fall outside the embedding's "
                f"{self.num_embeddings} rows; the data was tokenized with a larger vocabulary"
            )


class ColumnParallelLinear(_Linear):
    """Y = X A^T + b with A split by rows (output features): each rank computes Y's own columns.

    skip_bias_add: forward leaves this rank's bias slice out, for the caller to fuse it into the
    next op (the MLP's bias+GeLU reads `.bias`), as Megatron's `skip_bias_add`.
    gated: the output is [gate; up] (a gated MLP's), each rank holding its block of each half.
    sequence_parallel: the input is this rank's sequence slice, all-gathered before the matmul.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        groups: ParallelGroups,
        init_std: float,
        bias: bool = True,
        gather_output: bool = False,
        skip_bias_add: bool = False,
        sequence_parallel: bool = False,
        dtype: torch.dtype = torch.float32,
        gated: bool = False,
    ) -> None:
        super().__init__()
        self.sequence_parallel = sequence_parallel
        if out_features % groups.tp_size:
            raise ValueError(f"output size {out_features} is not divisible by {groups.tp_size}")
        self.groups, self.gather_output, self.skip_bias_add = groups, gather_output, skip_bias_add
        self.weight = _mark_parallel(
            nn.Parameter(
                _master_slice(
                    (out_features, in_features),
                    std=init_std,
                    partition_dim=0,
                    groups=groups,
                    dtype=dtype,
                    split=Split(GATED) if gated else None,
                )
            ),
            0,
        )
        self.bias = None
        if bias:
            self.bias = _mark_parallel(
                nn.Parameter(torch.zeros(out_features // groups.tp_size, dtype=dtype)), 0
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (S, B, in) [or its (S/TP, B, in) slice] -> (S, B, out/TP), or (S, B, out) gathered."""
        if self.sequence_parallel:  # x is this rank's sequence slice (S/TP, B, H)
            x = gather_from_sequence_parallel(x, self.groups.tp_group)
        else:
            x = copy_to_tensor_parallel(x, self.groups.tp_group)
        y = self._linear(x, None if self.skip_bias_add else self.bias)
        if self.gather_output:
            y = gather_from_tensor_parallel(y, self.groups.tp_group)
        return y


class RowParallelLinear(_Linear):
    """Y = X A^T + b with A split by columns (input features); partial products are all-reduced
    (reduce-scattered along the sequence with sequence_parallel) and the replicated bias added.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        groups: ParallelGroups,
        init_std: float,
        bias: bool = True,
        input_is_parallel: bool = True,
        sequence_parallel: bool = False,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.sequence_parallel = sequence_parallel
        if in_features % groups.tp_size:
            raise ValueError(f"input size {in_features} is not divisible by {groups.tp_size}")
        self.groups, self.input_is_parallel = groups, input_is_parallel
        self.weight = _mark_parallel(
            nn.Parameter(
                _master_slice(
                    (out_features, in_features),
                    std=init_std,
                    partition_dim=1,
                    groups=groups,
                    dtype=dtype,
                )
            ),
            1,
        )
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype)) if bias else None
        if self.bias is not None and self.sequence_parallel:
            self.bias.sequence_parallel = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (S, B, in/TP) -> (S, B, out) [or this rank's (S/TP, B, out) slice]."""
        if not self.input_is_parallel:
            x = scatter_to_tensor_parallel(x, self.groups.tp_group)
        if self.groups.tp_size == 1:
            # Nothing to reduce: let the GEMM add the bias (one pass over y fewer).
            return self._linear(x, self.bias)
        if self.sequence_parallel:  # out: this rank's sequence slice (S/TP, B, H)
            y = reduce_scatter_to_sequence_parallel(self._linear(x, None), self.groups.tp_group)
            bias = (
                None
                if self.bias is None
                else sequence_parallel_param(self.bias, self.groups.tp_group)
            )
        else:
            y = reduce_from_tensor_parallel(self._linear(x, None), self.groups.tp_group)
            bias = self.bias
        return y if bias is None else y + bias
