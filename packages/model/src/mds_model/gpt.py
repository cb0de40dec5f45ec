"""The plain GPT `nn.Module` (single process, or tensor-parallel with explicit groups).

Same layers as the pipeline (`pipeline.py`): Megatron's embedding (vocab-parallel words + learned
positions [+ BLOOM's embed LayerNorm]), N transformer layers on (S, B, H), a final LayerNorm and the
LM head tied to the word embeddings. Logits stay vocab-parallel (B, S, V/TP) and go straight into
the vocab-parallel cross-entropy, as Megatron's `parallel_lm_logits` and
`vocab_parallel_cross_entropy`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import kernels
from .attention import KVCache
from .config import GPTConfig
from .layers import LayerNorm, VocabParallelEmbedding, _master_slice
from .parallel import (
    ParallelGroups,
    copy_to_tensor_parallel,
    gather_from_sequence_parallel,
    gather_from_tensor_parallel,
    scatter_to_sequence_parallel,
)
from .rng import RNGStatesTracker, init_rng
from .transformer import ParallelTransformerLayer


class Embedding(nn.Module):
    """tokens (B, S) -> hidden (B, S, H): word [+ norm] + learned positions, then dropout."""

    def __init__(
        self, config: GPTConfig, *, groups: ParallelGroups, init_seed: int | None = None
    ) -> None:
        super().__init__()
        h, dtype, std = config.hidden_size, config.torch_dtype, config.init_method_std
        self.config = config
        with init_rng(init_seed):
            norm = None
            if config.embed_layernorm:
                norm = LayerNorm(
                    h,
                    eps=config.layernorm_epsilon,
                    use_kernel=config.use_fused_kernels,
                    dtype=dtype,
                )
            self.word_embeddings = VocabParallelEmbedding(
                config.padded_vocab_size, h, groups=groups, init_std=std, dtype=dtype, norm=norm
            )
            self.position_embeddings = None
            if config.position_embedding_type == "learned":
                self.position_embeddings = nn.Embedding(config.max_positions, h, dtype=dtype)
                self.position_embeddings.weight.data.copy_(
                    _master_slice(
                        (config.max_positions, h),
                        std=std,
                        partition_dim=0,
                        groups=ParallelGroups(),
                        dtype=dtype,
                    )
                )

    def forward(self, tokens: torch.Tensor, position_offset: int = 0) -> torch.Tensor:
        seq = tokens.shape[1]
        if position_offset + seq > self.config.max_positions:
            raise ValueError(
                f"positions up to {position_offset + seq} exceed max_position_embeddings "
                f"({self.config.max_positions})"
            )
        x = self.word_embeddings(tokens)  # (B, S, H)
        if self.position_embeddings is not None:
            positions = torch.arange(position_offset, position_offset + seq, device=tokens.device)
            x = x + self.position_embeddings(positions)
        p = self.config.hidden_dropout if self.training else 0.0
        return F.dropout(x, p=p) if p > 0.0 else x


def to_sequence_first(
    x: torch.Tensor, *, groups: ParallelGroups, sequence_parallel: bool
) -> torch.Tensor:
    """(B, S, H) -> (S, B, H), or this rank's (S/TP, B, H) slice with sequence parallelism."""
    x = x.transpose(0, 1).contiguous()
    if not sequence_parallel:
        return x
    if x.shape[0] % groups.tp_size:
        raise ValueError(
            f"sequence_parallel needs the sequence length ({x.shape[0]}) divisible by the "
            f"tensor-parallel size ({groups.tp_size})"
        )
    return scatter_to_sequence_parallel(x, groups.tp_group)


def to_batch_first(
    x: torch.Tensor, *, groups: ParallelGroups, sequence_parallel: bool
) -> torch.Tensor:
    """(S, B, H) [or the rank's sequence slice] -> the whole (B, S, H) on every rank."""
    if sequence_parallel:
        x = gather_from_sequence_parallel(x, groups.tp_group)
    return x.transpose(0, 1)


def lm_logits(
    hidden: torch.Tensor,
    word_embeddings: torch.Tensor,
    groups: ParallelGroups,
    *,
    sequence_parallel: bool = False,
) -> torch.Tensor:
    """hidden (B, S, H) @ this rank's vocab rows^T -> vocab-parallel logits (B, S, V/TP).

    With sequence parallelism the all-gather in `to_batch_first` already sums the ranks' input
    gradients (its backward is a reduce-scatter), so no copy_to_tensor_parallel here.
    """
    if not sequence_parallel:
        hidden = copy_to_tensor_parallel(hidden, groups.tp_group)
    return F.linear(hidden, word_embeddings)


def lm_losses(
    logits: torch.Tensor, labels: torch.Tensor, *, groups: ParallelGroups, use_kernel: bool
) -> torch.Tensor:
    """Per-token cross-entropy in fp32, (B, S), from vocab-parallel logits (B, S, V/TP)."""
    num_local = logits.shape[-1]
    losses = kernels.vocab_parallel_cross_entropy(
        logits.reshape(-1, num_local),
        labels.reshape(-1),
        group=groups.tp_group,
        vocab_start_index=groups.tp_rank * num_local,
        use_kernel=use_kernel,
    )
    return losses.view(labels.shape)


def masked_mean(losses: torch.Tensor, loss_mask: torch.Tensor | None) -> torch.Tensor:
    """Megatron's `sum(loss * mask) / sum(mask)`; a plain mean without a mask."""
    if loss_mask is None:
        return losses.mean()
    mask = loss_mask.to(losses.dtype)
    return (losses * mask).sum() / mask.sum()


class GPT(nn.Module):
    """Decoder-only GPT. forward(tokens) -> logits; forward(tokens, labels) -> per-token losses."""

    def __init__(
        self,
        config: GPTConfig,
        *,
        groups: ParallelGroups | None = None,
        rng_tracker: RNGStatesTracker | None = None,
        init_seed: int | None = 1234,
    ) -> None:
        super().__init__()
        groups = groups or ParallelGroups()
        if groups.tp_size != config.tensor_model_parallel_size:
            raise ValueError(
                f"tensor_model_parallel_size is {config.tensor_model_parallel_size} in the config "
                f"but "
                f"the tensor-parallel group has {groups.tp_size} ranks"
            )
        self.config, self.groups = config, groups
        self.embedding = Embedding(config, groups=groups, init_seed=init_seed)
        self.layers = nn.ModuleList(
            ParallelTransformerLayer(
                config,
                groups=groups,
                rng_tracker=rng_tracker,
                layer_number=i + 1,
                init_seed=init_seed,
            )
            for i in range(config.num_layers)
        )
        self.sequence_parallel = config.sequence_parallel and groups.tp_size > 1
        # With sequence parallelism the final norm runs after the all-gather, on gradients that
        # are partial per rank (the head has no copy_to_tensor_parallel): sum them over TP.
        self.final_layernorm = LayerNorm(
            config.hidden_size,
            eps=config.layernorm_epsilon,
            use_kernel=config.use_fused_kernels,
            dtype=config.torch_dtype,
            sequence_parallel_group=groups.tp_group if self.sequence_parallel else None,
        )

    def forward(
        self,
        tokens: torch.Tensor,
        labels: torch.Tensor | None = None,
        *,
        position_offset: int = 0,
        past_kvs: list[KVCache] | None = None,
        use_cache: bool = False,
    ):
        """tokens (B, S) int64. Returns losses (B, S) given labels, else vocab-parallel logits
        (B, S, V/TP); with use_cache also the list of per-layer (keys, values) for generation,
        whose positions continue at position_offset + S."""
        sp = self.sequence_parallel
        x = to_sequence_first(
            self.embedding(tokens, position_offset), groups=self.groups, sequence_parallel=sp
        )  # (S, B, H), or (S/TP, B, H) with sp
        presents = []
        for i, layer in enumerate(self.layers):
            past = past_kvs[i] if past_kvs is not None else None
            if use_cache:
                x, present = layer(x, position_offset=position_offset, past_kv=past, use_cache=True)
                presents.append(present)
            else:
                x = layer(x, position_offset=position_offset, past_kv=past)
        x, _ = self.final_layernorm(to_batch_first(x, groups=self.groups, sequence_parallel=sp))
        logits = lm_logits(  # (B, S, V/TP)
            x, self.embedding.word_embeddings.weight, self.groups, sequence_parallel=sp
        )
        out = (
            logits
            if labels is None
            else lm_losses(
                logits, labels, groups=self.groups, use_kernel=self.config.use_fused_kernels
            )
        )
        return (out, presents) if use_cache else out

    def gather_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Vocab-parallel logits (B, S, V/TP) -> full padded logits (B, S, V) on every rank."""
        return gather_from_tensor_parallel(logits, self.groups.tp_group)

    def num_parameters(self, *, exclude_embeddings: bool = False) -> int:
        """Parameters on this rank (tied head counted once)."""
        total = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            total -= sum(p.numel() for p in self.embedding.parameters())
        return total
