"""The GPT as a DeepSpeed `PipelineModule` with the spec list of Megatron-DeepSpeed's GPTModelPipe.

Indices match BS/MS GPTModelPipe so checkpoints are named alike (`layer_01-model_00-model_states.pt`
for the embedding, `layer_03..layer_{N+2}` for the transformer layers, `layer_{N+4}` for the final
LayerNorm): 0 input cast, 1 embedding (tied 'embed'), 2 transpose to (S, B, H), 3..N+2 layers,
N+3 transpose back, N+4 final LayerNorm, N+5 LM head tied to the embedding (no file), N+6 the slot
of Megatron's fp32 logits cast (here a pass-through: the vocab-parallel CE reads half logits).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

from .config import GPTConfig
from .gpt import (
    Embedding,
    check_groups,
    lm_logits,
    lm_losses,
    masked_mean,
    to_batch_first,
    to_sequence_first,
)
from .layers import LayerNorm
from .parallel import ParallelGroups
from .rng import RNGStatesTracker
from .transformer import ParallelTransformerLayer

EMBED_TIE_KEY = "embed"


class EmbeddingPipe(Embedding):
    """Stage-0 embedding; its `word_embeddings.weight` is tied to the last stage's LM head."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, S) -> (B, S, H)
        return super().forward(tokens)


class ParallelTransformerLayerPipe(ParallelTransformerLayer):
    """A transformer layer in the pipeline, (S, B, H) -> (S, B, H); the class name is Megatron's."""


class FinalLayerNormPipe(LayerNorm):
    """The final LayerNorm; its file holds plain `weight` and `bias`, as Megatron-DeepSpeed's."""


def _lm_head(embedding: EmbeddingPipe, hidden: torch.Tensor) -> torch.Tensor:
    """(B, S, H) -> vocab-parallel logits (B, S, V/TP) with the tied word embeddings."""
    return lm_logits(
        hidden,
        embedding.word_embeddings.weight,
        embedding.word_embeddings.groups,
        sequence_parallel=embedding.config.sequence_parallel_active,
    )


class _CastInputs:
    """Slot 0: Megatron casts floating inputs to the half dtype; token ids pass through."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __call__(self, inputs):
        if torch.is_tensor(inputs) and inputs.is_floating_point():
            return inputs.to(self.dtype)
        return inputs


class _Transpose:
    """Slots 2 and N+3: (B, S, H) <-> (S, B, H); sequence parallelism scatters / gathers S."""

    def __init__(self, *, to_sequence_first: bool, groups: ParallelGroups, sequence_parallel: bool):
        self.to_sequence_first, self.groups = to_sequence_first, groups
        self.sequence_parallel = sequence_parallel

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        move = to_sequence_first if self.to_sequence_first else to_batch_first
        return move(x, groups=self.groups, sequence_parallel=self.sequence_parallel)


def _logits_pass_through(logits: torch.Tensor) -> torch.Tensor:
    # Megatron casts logits to fp32 here; the CE kernel reads them in their own dtype instead,
    # so no fp32 copy of (tokens, vocab) is made. The slot stays to keep Megatron's indices.
    return logits


class PipeLoss:
    """loss_fn(logits, labels) of the pipeline: labels is (labels, loss_mask) or a labels tensor."""

    def __init__(self, *, groups: ParallelGroups, use_kernel: bool) -> None:
        self.groups, self.use_kernel = groups, use_kernel

    def __call__(self, logits: torch.Tensor, labels) -> torch.Tensor:
        labels, loss_mask = labels if isinstance(labels, (tuple, list)) else (labels, None)
        losses = lm_losses(logits, labels, groups=self.groups, use_kernel=self.use_kernel)
        return masked_mean(losses, loss_mask)


def gpt_layer_specs(
    config: GPTConfig,
    *,
    groups: ParallelGroups,
    rng_tracker: RNGStatesTracker | None,
    init_seed: int | None = 1234,
) -> list:
    """The N+7 entries of GPTModelPipe, in Megatron-DeepSpeed's order."""
    embed_kwargs = {"groups": groups, "init_seed": init_seed}
    sp = config.sequence_parallel_active
    specs: list[LayerSpec | Callable] = [
        _CastInputs(config.torch_dtype),
        TiedLayerSpec(
            EMBED_TIE_KEY,
            EmbeddingPipe,
            config,
            **embed_kwargs,
            tied_weight_attr="word_embeddings.weight",
        ),
        _Transpose(to_sequence_first=True, groups=groups, sequence_parallel=sp),
    ]
    for i in range(config.num_layers):
        specs.append(
            LayerSpec(
                ParallelTransformerLayerPipe,
                config,
                groups=groups,
                rng_tracker=rng_tracker,
                layer_number=i + 1,
                init_seed=init_seed,
            )
        )
    specs += [
        _Transpose(to_sequence_first=False, groups=groups, sequence_parallel=sp),
        LayerSpec(
            FinalLayerNormPipe,
            config.hidden_size,
            eps=config.layernorm_epsilon,
            use_kernel=config.use_fused_kernels,
            dtype=config.torch_dtype,
            sequence_parallel_group=groups.tp_group if sp else None,
        ),
        TiedLayerSpec(
            EMBED_TIE_KEY,
            EmbeddingPipe,
            config,
            **embed_kwargs,
            forward_fn=_lm_head,
            tied_weight_attr="word_embeddings.weight",
        ),
        _logits_pass_through,
    ]
    return specs


def pipeline_deepspeed_config(config: GPTConfig) -> dict:
    """Entries the DeepSpeed JSON must hold for this model's pipeline.

    DeepSpeed's engine sends each TP rank 1/TP of an activation ("pipe_partitioned") assuming
    activations are replicated over TP; sequence-parallel activations are per-rank slices, so
    that must be off, else stages receive a mix of slices.
    """
    if not config.sequence_parallel_active:
        return {}
    return {"pipeline": {"pipe_partitioned": False, "grad_partitioned": False}}


def build_gpt_pipe(
    config: GPTConfig,
    *,
    groups: ParallelGroups,
    rng_tracker: RNGStatesTracker | None,
    init_seed: int | None = 1234,
    partition_method: str = "type:transformer",
) -> PipelineModule:
    """A PipelineModule over the groups' (pp, dp, tp) grid; layers spread evenly by default."""
    check_groups(config, groups)
    if config.num_layers < groups.pp_size:
        raise ValueError(
            f"num_layers ({config.num_layers}) must be at least the pipeline size "
            f"({groups.pp_size})"
        )
    # Same rank order as ParallelGroups.build: pipe outermost, then data, tensor ("model") fastest.
    topology = PipeModelDataParallelTopology(
        num_pp=groups.pp_size, num_mp=groups.tp_size, num_dp=groups.dp_size
    )
    return PipelineModule(
        layers=gpt_layer_specs(config, groups=groups, rng_tracker=rng_tracker, init_seed=init_seed),
        loss_fn=PipeLoss(groups=groups, use_kernel=config.use_fused_kernels),
        topology=topology,
        partition_method=partition_method,
        activation_checkpoint_interval=0,
    )
