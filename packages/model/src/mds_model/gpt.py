"""The plain GPT `nn.Module` (single process, or tensor-parallel with explicit groups).

`GPT.forward(tokens, labels)` is the training call and returns per-token losses; `GPT.logits`
returns logits: one kind of result per method. Decoding with a KV cache runs over the same
parameters in `mds_model.decoding` (`Decoder`).

Same layers as the pipeline (`pipeline.py`): Megatron's embedding (vocab-parallel words + learned
positions [+ BLOOM's embed LayerNorm]), N transformer layers on (S, B, H), a final norm and the
LM head: the word embeddings (tied), or Megatron's untied `output_layer` (vocab-parallel rows).
Logits stay vocab-parallel (B, S, V/TP) and go straight into the vocab-parallel cross-entropy, as
Megatron's `parallel_lm_logits` and `vocab_parallel_cross_entropy`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import kernels
from .config import GPTConfig, check_tensor_parallel
from .layers import LayerNorm, VocabParallelEmbedding, _mark_parallel, _master_slice, norm_for
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
            if config.learned_positions:
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

    def forward(
        self,
        tokens: torch.Tensor,
        position_offset: int = 0,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """positions (B, S): per-row positions (cached decoding of ragged rows); else the
        positions are position_offset onwards for every row."""
        seq = tokens.shape[1]
        if positions is None and position_offset + seq > self.config.max_positions:
            raise ValueError(
                f"positions up to {position_offset + seq} exceed max_position_embeddings "
                f"({self.config.max_positions})"
            )
        x = self.word_embeddings(tokens)  # (B, S, H)
        if self.position_embeddings is not None:
            if positions is None:
                positions = torch.arange(
                    position_offset, position_offset + seq, device=tokens.device
                )
            x = x + self.position_embeddings(positions)
        p = self.config.hidden_dropout if self.training else 0.0
        return F.dropout(x, p=p) if p > 0.0 else x


class OutputLayer(nn.Module):
    """The untied LM head's weight (upstream's --untie-embeddings-and-output-weights): this rank's
    rows of the padded vocabulary, as the word embeddings' (Megatron's `output_layer`, the
    pipeline's `lm_head`: a column-parallel linear without bias); `lm_logits` applies it."""

    def __init__(self, config: GPTConfig, *, groups: ParallelGroups) -> None:
        super().__init__()
        self.groups, self.config = groups, config
        weight = _master_slice(
            (config.padded_vocab_size, config.hidden_size),
            std=config.init_method_std,
            partition_dim=0,
            groups=groups,
            dtype=config.torch_dtype,
        )
        self.weight = _mark_parallel(nn.Parameter(weight), 0)


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
    """Decoder-only GPT: `forward(tokens, labels)` -> per-token losses (B, S) (the call DDP or a
    DeepSpeed engine wraps); `logits(tokens)` -> vocab-parallel logits (B, S, V/TP)."""

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
        check_tensor_parallel(config, groups.tp_size)
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
        # With sequence parallelism the final norm runs after the all-gather, on gradients that
        # are partial per rank (the head has no copy_to_tensor_parallel): sum them over TP.
        sp = config.sequence_parallel
        self.final_layernorm = norm_for(
            config, sequence_parallel_group=groups.tp_group if sp else None
        )
        self.output_layer = None
        if config.untie_embeddings_and_output_weights:
            with init_rng(None if init_seed is None else init_seed + config.num_layers + 1):
                self.output_layer = OutputLayer(config, groups=groups)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """tokens, labels (B, S) int64 -> per-token cross-entropy (B, S) in fp32.

        Reduce it with `masked_mean(losses, loss_mask)` (Megatron's loss).
        """
        return lm_losses(
            self.logits(tokens),
            labels,
            groups=self.groups,
            use_kernel=self.config.use_fused_kernels,
        )

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (B, S) int64 -> this rank's vocab-parallel logits (B, S, padded V / TP).

        `gather_logits` makes them whole; the padded columns past `config.vocab_size` are real
        (trained-down) logits, as in Megatron: drop them before sampling.
        """
        sp = self.config.sequence_parallel
        x = to_sequence_first(
            self.embedding(tokens), groups=self.groups, sequence_parallel=sp
        )  # (S, B, H), or (S/TP, B, H) with sp
        for layer in self.layers:
            x = layer(x)
        return self._head(to_batch_first(x, groups=self.groups, sequence_parallel=sp))

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm and the LM head: (B, S, H) -> (B, S, V/TP)."""
        return self.lm_head(self.final_layernorm(x))

    @property
    def head_weight(self) -> torch.Tensor:
        """The LM head's rows of the padded vocabulary on this rank (B, S, H) @ weight^T: the
        untied output layer's, or the word embeddings'."""
        if self.output_layer is not None:
            return self.output_layer.weight
        return self.embedding.word_embeddings.weight

    def lm_head(self, normed: torch.Tensor) -> torch.Tensor:
        """The final norm's output (B, S, H) -> vocab-parallel logits (B, S, V/TP): the untied
        output layer, or the word embeddings."""
        return lm_logits(
            normed,
            self.head_weight,
            self.groups,
            sequence_parallel=self.config.sequence_parallel,
        )

    def gather_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Vocab-parallel logits (B, S, V/TP) -> full padded logits (B, S, V) on every rank."""
        return gather_from_tensor_parallel(logits, self.groups.tp_group)

    def num_parameters(self, *, exclude_embeddings: bool = False) -> int:
        """Parameters on this rank (a tied head counted once; an untied one is an embedding)."""
        total = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            total -= sum(p.numel() for p in self.embedding.parameters())
            if self.output_layer is not None:
                total -= self.output_layer.weight.numel()
        return total
