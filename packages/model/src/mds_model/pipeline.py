"""The GPT as a DeepSpeed `PipelineModule` with the spec list of Megatron-DeepSpeed's GPTModelPipe.

Indices match deepspeedai/Megatron-DeepSpeed's GPTModelPipe (megatron/model/gpt_model.py), so its
`pretrain_gpt.py` reads the layer files as its own (`layer_01-model_00-model_states.pt` for the
embedding, `layer_02..layer_{N+1}` for the transformer layers, `layer_{N+2}` for the final
LayerNorm): 0 input cast, 1 embedding (tied 'embed'; its output is sequence-first, (S, B, H)),
2..N+1 layers, N+2 final norm (back to batch-first), N+3 LM head tied to the embedding (no
file; untied: upstream's LMHeadPipe, `lm_head.weight` in its own file, and the embedding not
tied), N+4 the slot of Megatron's fp32 logits cast (here a pass-through: the vocab-parallel CE
reads half logits). bigscience's fork puts transpose lambdas at 2 and N+3 instead, numbering the
layers 3..N+2 and the norm N+4 (what mds-train wrote before; `GPTPipe.ckpt_layer_path_list`
still reads those files).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable

import torch
from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

from .config import GPTConfig, check_tensor_parallel
from .gpt import (
    Embedding,
    OutputLayer,
    lm_logits,
    lm_losses,
    masked_mean,
    to_batch_first,
    to_sequence_first,
)
from .layers import LayerNorm, RMSNorm
from .naming import LAYER_FILE, OWN_NUMBERING, pipe_numbering, renumber
from .parallel import ParallelGroups
from .rng import RNGStatesTracker, init_rng
from .transformer import ParallelTransformerLayer

EMBED_TIE_KEY = "embed"


class EmbeddingPipe(Embedding):
    """Stage-0 embedding; its `word_embeddings.weight` is tied to the last stage's LM head."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, S) -> (S, B, H)
        return to_sequence_first(
            super().forward(tokens),
            groups=self.word_embeddings.groups,
            sequence_parallel=self.config.sequence_parallel,
        )


class ParallelTransformerLayerPipe(ParallelTransformerLayer):
    """A transformer layer in the pipeline, (S, B, H) -> (S, B, H); the class name is Megatron's."""


class _FinalNormPipe:
    """The final norm, (S, B, H) -> (B, S, H); its file holds the norm's plain `weight` [and
    `bias`], as Megatron-DeepSpeed's."""

    def __init__(
        self, hidden_size: int, *, groups: ParallelGroups, sequence_parallel: bool, **kwargs
    ) -> None:
        super().__init__(hidden_size, **kwargs)
        self.groups, self.sequence_parallel = groups, sequence_parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sp = self.sequence_parallel
        batch_first = to_batch_first(x, groups=self.groups, sequence_parallel=sp)
        return super().forward(batch_first)


class FinalLayerNormPipe(_FinalNormPipe, LayerNorm):
    pass


class FinalRMSNormPipe(_FinalNormPipe, RMSNorm):
    pass


# GPTConfig.normalization -> the pipeline's final norm (layers.NORMS's, in pipeline form).
FINAL_NORM_PIPES = {"layernorm": FinalLayerNormPipe, "rmsnorm": FinalRMSNormPipe}


class LMHeadPipe(torch.nn.Module):
    """The untied LM head, (B, S, H) -> vocab-parallel logits; its file holds `lm_head.weight`,
    as upstream's LMHeadPipe (megatron/model/transformer.py)."""

    def __init__(self, config: GPTConfig, *, groups: ParallelGroups, init_seed: int | None):
        super().__init__()
        with init_rng(None if init_seed is None else init_seed + config.num_layers + 1):
            self.lm_head = OutputLayer(config, groups=groups)
        self.groups, self.config = groups, config

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return lm_logits(
            hidden,
            self.lm_head.weight,
            self.groups,
            sequence_parallel=self.config.sequence_parallel,
        )


def _lm_head(embedding: EmbeddingPipe, hidden: torch.Tensor) -> torch.Tensor:
    """(B, S, H) -> vocab-parallel logits (B, S, V/TP) with the tied word embeddings."""
    return lm_logits(
        hidden,
        embedding.word_embeddings.weight,
        embedding.word_embeddings.groups,
        sequence_parallel=embedding.config.sequence_parallel,
    )


class _CastInputs:
    """Slot 0: Megatron casts floating inputs to the half dtype; token ids pass through."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __call__(self, inputs):
        if torch.is_tensor(inputs) and inputs.is_floating_point():
            return inputs.to(self.dtype)
        return inputs


def _logits_pass_through(logits: torch.Tensor) -> torch.Tensor:
    # Megatron casts logits to fp32 here; the CE kernel reads them in their own dtype instead,
    # so no fp32 copy of (tokens, vocab) is made.
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
    """The N+5 entries of GPTModelPipe, in deepspeedai/Megatron-DeepSpeed's order."""
    embed_kwargs = {"groups": groups, "init_seed": init_seed}
    sp = config.sequence_parallel
    untied = config.untie_embeddings_and_output_weights
    embedding = (
        LayerSpec(EmbeddingPipe, config, **embed_kwargs)
        if untied
        else TiedLayerSpec(
            EMBED_TIE_KEY,
            EmbeddingPipe,
            config,
            **embed_kwargs,
            tied_weight_attr="word_embeddings.weight",
        )
    )
    specs: list[LayerSpec | Callable] = [_CastInputs(config.torch_dtype), embedding]
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
    head = (
        LayerSpec(LMHeadPipe, config, groups=groups, init_seed=init_seed)
        if untied
        else TiedLayerSpec(
            EMBED_TIE_KEY,
            EmbeddingPipe,
            config,
            **embed_kwargs,
            forward_fn=_lm_head,
            tied_weight_attr="word_embeddings.weight",
        )
    )
    specs += [
        LayerSpec(
            FINAL_NORM_PIPES[config.normalization],
            config.hidden_size,
            groups=groups,
            sequence_parallel=sp,
            eps=config.layernorm_epsilon,
            use_kernel=config.use_fused_kernels,
            dtype=config.torch_dtype,
            sequence_parallel_group=groups.tp_group if sp else None,
        ),
        head,
        _logits_pass_through,
    ]
    return specs


class GPTPipe(PipelineModule):
    """DeepSpeed's PipelineModule over `gpt_layer_specs`. It saves layer files in its own
    (deepspeedai's) numbering and loads folders in either fork's: a folder numbered as bigscience's
    fork numbers (mds-train's own files before it took deepspeedai's numbering) is read with each
    spec index mapped to that numbering."""

    def __init__(self, *, num_layers: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.num_layers = num_layers

    def ckpt_layer_path_list(self, ckpt_dir: str, local_layer_idx: int) -> list[str]:
        # DeepSpeed's `load_state_dir` asks for each local layer's files here; its own version
        # adds the private `_local_start`, which is this stage's first spec index, as public
        # `partitions()[stage_id]` says (tests/train/test_deepspeed_contract.py checks both).
        index = local_layer_idx + self.partitions()[self.stage_id]
        numbering = _folder_numbering(ckpt_dir)
        if numbering is not None and numbering != OWN_NUMBERING:
            index = renumber(index, self.num_layers, source=OWN_NUMBERING, target=numbering)
        return sorted(glob.glob(os.path.join(ckpt_dir, f"layer_{index:02d}-*model_states.pt")))


def _folder_numbering(ckpt_dir: str) -> str | None:
    indices = set()
    for name in os.listdir(ckpt_dir):
        match = LAYER_FILE.fullmatch(name)
        if match:
            indices.add(int(match.group(1)))
    return pipe_numbering(sorted(indices))


def pipeline_deepspeed_config(config: GPTConfig) -> dict:
    """Entries the DeepSpeed JSON must hold for this model's pipeline.

    DeepSpeed's engine sends each TP rank 1/TP of an activation ("pipe_partitioned") assuming
    activations are replicated over TP; sequence-parallel activations are per-rank slices, so
    that must be off, else stages receive a mix of slices.
    """
    if not config.sequence_parallel:
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
    check_tensor_parallel(config, groups.tp_size)
    if config.num_layers < groups.pp_size:
        raise ValueError(
            f"num_layers ({config.num_layers}) must be at least the pipeline size "
            f"({groups.pp_size})"
        )
    # Same rank order as ParallelGroups.build: pipe outermost, then data, tensor ("model") fastest.
    topology = PipeModelDataParallelTopology(
        num_pp=groups.pp_size, num_mp=groups.tp_size, num_dp=groups.dp_size
    )
    return GPTPipe(
        num_layers=config.num_layers,
        layers=gpt_layer_specs(config, groups=groups, rng_tracker=rng_tracker, init_seed=init_seed),
        loss_fn=PipeLoss(groups=groups, use_kernel=config.use_fused_kernels),
        topology=topology,
        partition_method=partition_method,
        activation_checkpoint_interval=0,
    )
