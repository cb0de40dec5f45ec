"""The model, its optimizer and the DeepSpeed engine, built from the config in a fixed order.

PP > 1 uses DeepSpeed's pipeline engine over `build_gpt_pipe` (ZeRO 0-1); PP = 1 the plain engine
over the GPT (ZeRO 0-3, CPU offload). Parameter groups follow Megatron: no weight decay on biases
and LayerNorm parameters. The optimizer is torch's AdamW (fused on GPUs) unless the user's
DeepSpeed config names one, or DeepSpeed's CPU Adam when the optimizer is offloaded.
`build_training_setup` is a fixed sequence of steps (torchtitan's `apply_*` style), each of which
says when it applies; DeepSpeed's internals are reached through deepspeed_engine.py only.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from mds_model import (
    GPT,
    GPTConfig,
    ParallelGroups,
    RNGStatesTracker,
    masked_mean,
    model_parallel_seed,
)

from .config import Topology, TrainConfig
from .deepspeed_engine import (
    built_optimizer,
    pipeline_model_parallel_group,
    skip_backward_allreduce,
)
from .ds_config import (
    derive_deepspeed_config,
    merge_deepspeed_config,
    offloads_optimizer,
    uses_master_weights,
    uses_own_zero3,
    uses_sharded_master_weights,
)
from .fully_sharded import (
    FullyShardedAdamW,
    SingleRankZero3AdamW,
    data_parallel_mesh,
    shard_model,
)
from .gradients import install_fp32_clipping
from .master_weights import MasterWeightAdamW
from .param_groups import UPSTREAM_GROUP_KEYS
from .sharded_master_weights import ShardedMasterAdamW

logger = logging.getLogger(__name__)


class TrainingGPT(torch.nn.Module):
    """The GPT that the plain engine (PP = 1) trains, as upstream's `GPTModel` presents itself:

    - forward is the masked mean loss (DeepSpeed's engine calls forward; ZeRO-3 gathers
      parameters in the submodules' forward hooks);
    - the GPT's modules are registered under Megatron's nesting (`language_model.embedding`,
      `language_model.encoder.layers.I`, `language_model.encoder.final_layernorm` and, untied,
      `language_model.output_layer`, as upstream's language_model.py), so DeepSpeed's
      files (`param_shapes`, ZeRO partitions, universal checkpoints) name parameters as
      Megatron-DeepSpeed's do;
    - `state_dict` is the nested dict upstream's `state_dict_for_save_checkpoint` writes (what its
      `GPTModel.load_state_dict` reads); `load_state_dict` reads that and mds-train's earlier
      flat names (`layers.I.X`).
    """

    def __init__(self, config: GPTConfig, **kwargs: Any) -> None:
        super().__init__()
        gpt = GPT(config, **kwargs)
        self.language_model = torch.nn.Module()
        self.language_model.embedding = gpt.embedding
        self.language_model.encoder = torch.nn.Module()
        self.language_model.encoder.layers = gpt.layers
        self.language_model.encoder.final_layernorm = gpt.final_layernorm
        if gpt.output_layer is not None:  # untied; tied, the head is the word embeddings
            self.language_model.output_layer = gpt.output_layer
        # It computes with the modules registered above; registering it as well would name each
        # parameter twice.
        object.__setattr__(self, "gpt", gpt)

    def forward(self, tokens, labels, loss_mask):  # noqa: D102 - (B, S) x3 -> scalar
        return masked_mean(self.gpt(tokens, labels), loss_mask)

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # noqa: D102
        from mds_checkpoint import megatron_nested

        return megatron_nested(self.gpt.state_dict(*args, **kwargs))

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True, assign=False):  # noqa: D102
        from mds_checkpoint import megatron_flat, plain_parameter_name

        if "language_model" in state_dict:
            flat = megatron_flat(state_dict)
        elif any(key.startswith("language_model.") for key in state_dict):
            # the engine's own names (DeepSpeed's stage 3 loads the weights alone so, rebuilt
            # from its partitions)
            flat = {plain_parameter_name(k, num_layers=0, pipeline=False): v
                    for k, v in state_dict.items()}  # fmt: skip
        else:
            flat = state_dict
        return self.gpt.load_state_dict(flat, strict=strict, assign=assign)


class DeepSpeedMPU:
    """The model-parallel view DeepSpeed's plain engine asks for, over our explicit groups."""

    def __init__(self, groups: ParallelGroups) -> None:
        self.groups = groups
        self._data_parallel_group = _data_parallel_group(groups)

    def get_model_parallel_rank(self) -> int:
        return self.groups.tp_rank

    def get_model_parallel_world_size(self) -> int:
        return self.groups.tp_size

    def get_model_parallel_group(self):
        return self.groups.tp_group

    get_tensor_model_parallel_rank = get_model_parallel_rank
    get_tensor_model_parallel_world_size = get_model_parallel_world_size
    get_tensor_model_parallel_group = get_model_parallel_group

    def get_data_parallel_rank(self) -> int:
        return self.groups.dp_rank

    def get_data_parallel_world_size(self) -> int:
        return self.groups.dp_size

    def get_data_parallel_group(self):
        return self._data_parallel_group


def _data_parallel_group(groups: ParallelGroups):
    """The DP group, or this rank's own one-member group (DeepSpeed reduces over it either way);
    collective: every rank creates every singleton, in the same order."""
    if groups.dp_group is not None:
        return groups.dp_group
    import torch.distributed as dist

    mine = None
    for rank in range(dist.get_world_size()):
        group = dist.new_group([rank])
        if rank == dist.get_rank():
            mine = group
    return mine


@dataclass
class TrainingSetup:
    engine: Any
    optimizer: torch.optim.Optimizer  # the one whose param groups carry the learning rate
    groups: ParallelGroups
    rng_tracker: RNGStatesTracker
    gpt_config: GPTConfig
    ds_config: dict[str, Any]  # what the engine runs
    is_pipeline: bool
    fp8: Any = None  # mds_model.fp8.Fp8Training under --fp8-e4m3/--fp8-hybrid: update per step


def parameter_groups(
    module: torch.nn.Module, weight_decay: float, *, config: GPTConfig, is_pipeline: bool = False
) -> list[dict[str, Any]]:
    """Megatron's `_get_params_for_weight_decay_optimization`: norms and biases get no decay.

    Which ones those are is mds_model's parameter table's `decay` (by each parameter's plain
    name): the same table mds-merge-mp reads the optimizer's order from
    (mds_checkpoint.engine_names.optimizer_order), so a new weight cannot land in one group here
    and in the other there.
    """
    from mds_checkpoint import plain_parameter_name
    from mds_model.parameters import parameters

    decays = {param.name: param.decay for param in parameters(config)}
    decay, no_decay = [], []
    for name, param in module.named_parameters():  # tied parameters come once
        if param.requires_grad:
            plain = plain_parameter_name(name, num_layers=config.num_layers, pipeline=is_pipeline)
            if plain not in decays:  # the table and the module disagree: an internal bug
                raise RuntimeError(f"{name} ({plain}) is not in mds_model's parameter table")
            (decay if decays[plain] else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": weight_decay, **UPSTREAM_GROUP_KEYS[0]},
        {"params": no_decay, "weight_decay": 0.0, **UPSTREAM_GROUP_KEYS[1]},
    ]
    return [group for group in groups if group["params"]]


def _client_optimizer(
    config: TrainConfig, params: list[dict], *, offload: bool, master_weights: bool
):
    opt = config.optimizer
    if opt.optimizer == "sgd":
        return torch.optim.SGD(params, lr=0.0, momentum=opt.sgd_momentum)
    betas = (opt.adam_beta1, opt.adam_beta2)
    if master_weights:  # its Triton step wherever it can run, unless kernels are turned off
        use_kernel = False if config.model.no_fused_kernels else None
        return MasterWeightAdamW(params, betas=betas, eps=opt.adam_eps, use_kernel=use_kernel)
    if offload:
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(params, lr=0.0, betas=betas, eps=opt.adam_eps, adamw_mode=True)
    fused = torch.cuda.is_available()
    return torch.optim.AdamW(params, lr=0.0, betas=betas, eps=opt.adam_eps, fused=fused)


def _sharded_optimizer(
    config: TrainConfig, params: list[dict], module: torch.nn.Module, groups: ParallelGroups
) -> ShardedMasterAdamW:
    """ZeRO-1/2 over this run's data-parallel group: its Triton step wherever it can run, unless
    kernels are turned off."""
    opt = config.optimizer
    return ShardedMasterAdamW(
        params,
        betas=(opt.adam_beta1, opt.adam_beta2),
        eps=opt.adam_eps,
        names={param: name for name, param in module.named_parameters()},
        data_parallel_group=groups.dp_group,
        data_parallel_rank=groups.dp_rank,
        data_parallel_size=groups.dp_size,
        clip_grad=opt.clip_grad,
        stage=config.parallel.zero_stage,
        use_kernel=False if config.model.no_fused_kernels else None,
    )


def _zero3_optimizer(
    config: TrainConfig,
    params: list[dict],
    module: torch.nn.Module,
    groups: ParallelGroups,
    user_ds: dict[str, Any],
) -> FullyShardedAdamW | SingleRankZero3AdamW:
    """ZeRO-3: above one data-parallel rank AdamW over this rank's rows of FSDP2's fp32 shards
    (bound to them once the model is sharded, apply_fully_sharded); at one, MasterWeightAdamW's
    step. The file's sub_group_size shapes their DeepSpeed stage-3 files as it would shape
    DeepSpeed's."""
    opt = config.optimizer
    betas, eps = (opt.adam_beta1, opt.adam_beta2), opt.adam_eps
    names = {param: name for name, param in module.named_parameters()}
    sub_group_size = int(float(user_ds.get("zero_optimization", {}).get("sub_group_size", 0)))
    if groups.dp_size == 1:
        use_kernel = False if config.model.no_fused_kernels else None
        return SingleRankZero3AdamW(
            params, names=names, sub_group_size=sub_group_size, betas=betas, eps=eps,
            use_kernel=use_kernel,
        )  # fmt: skip
    return FullyShardedAdamW(
        params,
        betas=betas,
        eps=eps,
        names=names,
        data_parallel_group=groups.dp_group,
        data_parallel_rank=groups.dp_rank,
        data_parallel_size=groups.dp_size,
        sub_group_size=sub_group_size,
    )


def build_training_setup(
    config: TrainConfig, topology: Topology, gpt_config: GPTConfig, user_ds: dict[str, Any]
) -> TrainingSetup:
    """The model, its optimizer and the engine, in a fixed order of steps; each step says when it
    applies. `user_ds`: the user's DeepSpeed file, already folded into `config` (ds_file.py)."""
    groups = ParallelGroups.build(
        tensor_parallel_size=topology.tensor_model_parallel_size,
        pipeline_parallel_size=topology.pipeline_model_parallel_size,
    )
    tracker = seed_everything(config.precision.seed, groups)
    is_pipeline = topology.pipeline_model_parallel_size > 1
    module = build_module(
        gpt_config, groups, tracker, seed=config.precision.seed, is_pipeline=is_pipeline
    )
    fp8 = apply_fp8(module, config, gpt_config)
    ds_config = build_deepspeed_config(
        config, topology, gpt_config, user_ds, is_pipeline=is_pipeline
    )
    params = parameter_groups(
        module, config.optimizer.weight_decay, config=gpt_config, is_pipeline=is_pipeline
    )
    optimizer = build_client_optimizer(
        config, topology, params, ds_config, user_ds, module=module, groups=groups
    )
    apply_zero3_external_parameters(module, ds_config, is_pipeline=is_pipeline)
    engine = initialize_engine(
        module, optimizer, params, ds_config, groups, is_pipeline=is_pipeline
    )
    apply_fully_sharded(engine, optimizer, module, groups, compute_dtype=gpt_config.torch_dtype)
    apply_fp32_clipping(engine, ds_config, groups, is_pipeline=is_pipeline)
    apply_gradient_reduction_in_backward(engine, optimizer, module, config, topology, groups)
    apply_weight_gather_in_forward(optimizer, module)
    apply_single_replica_shortcut(engine, ds_config, groups, is_pipeline=is_pipeline)
    return TrainingSetup(
        engine=engine,
        optimizer=optimizer or built_optimizer(engine),  # DeepSpeed built it from the file
        groups=groups,
        rng_tracker=tracker,
        gpt_config=gpt_config,
        ds_config=ds_config,
        is_pipeline=is_pipeline,
        fp8=fp8,
    )


def seed_everything(seed: int, groups: ParallelGroups) -> RNGStatesTracker:
    """Python's, numpy's and torch's generators, and the model-parallel RNG tracker."""
    random.seed(seed)
    np.random.seed(seed)
    return model_parallel_seed(seed, tp_rank=groups.tp_rank, pp_rank=groups.pp_rank)


def build_module(
    gpt_config: GPTConfig,
    groups: ParallelGroups,
    tracker: RNGStatesTracker,
    *,
    seed: int,
    is_pipeline: bool,
) -> torch.nn.Module:
    """The pipeline's stages (PP > 1) or the whole GPT, on the GPU where there is one."""
    from mds_model import build_gpt_pipe

    if is_pipeline:
        module = build_gpt_pipe(gpt_config, groups=groups, rng_tracker=tracker, init_seed=seed)
    else:
        module = TrainingGPT(gpt_config, groups=groups, rng_tracker=tracker, init_seed=seed)
    return module.cuda() if torch.cuda.is_available() else module


def apply_fp8(module: torch.nn.Module, config: TrainConfig, gpt_config: GPTConfig):
    """Under --fp8-e4m3/--fp8-hybrid: the transformer layers' linears in FP8 (mds_model.fp8), with
    their scaling state on the module's device; the weights and optimizer stay as they are."""
    recipe = config.precision.fp8_recipe()
    if recipe is None:
        return None
    from mds_model.fp8 import enable_fp8

    return enable_fp8(module, recipe, use_kernel=gpt_config.use_fused_kernels)


def capture_layer_graphs(setup: TrainingSetup, *, micro_batch_size: int) -> None:
    """Each transformer layer's training forward and backward become CUDA graph replays
    (mds_model.cuda_graphs), captured at the micro-batch's shape (TrainConfig.uses_cuda_graphs)."""
    from mds_model.cuda_graphs import graph_layers

    gpt, config = setup.engine.module.gpt, setup.gpt_config
    setup.engine.train()
    try:
        graph_layers(
            gpt.layers,
            sample_shape=(config.seq_length, micro_batch_size, config.hidden_size),
            dtype=config.torch_dtype,
        )
    except torch.cuda.OutOfMemoryError as error:
        # Graphs keep their pool's memory reserved (345M: 22.4 GiB against 20.3 eager), so a
        # run that fits eagerly may not fit graphed; say how to have the eager run.
        raise ValueError(
            "CUDA graphs: capturing the layers ran out of GPU memory; give --no-cuda-graph, or a "
            "smaller --micro-batch-size"
        ) from error
    logger.info("CUDA graphs captured for the %d transformer layers", len(gpt.layers))


def apply_fully_sharded(
    engine,
    optimizer: torch.optim.Optimizer | None,
    module: torch.nn.Module,
    groups: ParallelGroups,
    *,
    compute_dtype: torch.dtype,
) -> None:
    """ZeRO-3 above one rank (FullyShardedAdamW; ds_config.uses_own_zero3): FSDP2 over the DP
    group, one unit per transformer layer (fully_sharded.py), once the engine holds the model
    (its `module.to` and broadcast cannot take FSDP2's shards); the weights become fp32 shards,
    computed in `compute_dtype`, and the optimizer steps those. FSDP2 reduce-scatters the
    gradients in backward, so DeepSpeed's all-reduce after it goes."""
    if not isinstance(optimizer, FullyShardedAdamW):
        return
    device = "cuda" if torch.cuda.is_available() else "cpu"
    mesh = data_parallel_mesh(_data_parallel_group(groups), device)
    shard_model(module, module.gpt.layers, mesh, compute_dtype=compute_dtype)
    optimizer.bind(module)
    skip_backward_allreduce(engine)


def build_deepspeed_config(
    config: TrainConfig,
    topology: Topology,
    gpt_config: GPTConfig,
    user_ds: dict[str, Any],
    *,
    is_pipeline: bool,
) -> dict[str, Any]:
    """The derived DeepSpeed config with the user's file over it."""
    from mds_model import pipeline_deepspeed_config

    derived = derive_deepspeed_config(
        config,
        topology,
        pipeline_entries=pipeline_deepspeed_config(gpt_config) if is_pipeline else {},
        client_optimizer="optimizer" not in user_ds,
        sharded_master_weights=uses_sharded_master_weights(config, topology, user_ds)
        or uses_own_zero3(config, topology, user_ds),
    )
    return merge_deepspeed_config(derived, user_ds)


def recorded_deepspeed_config(
    config: TrainConfig, topology: Topology, user_ds: dict[str, Any]
) -> dict[str, Any]:
    """The DeepSpeed config the checkpoint files record: what DeepSpeed would run for these flags
    and file if it kept the optimizer (bf16 at the ZeRO stage asked), for the readers that look
    (DeepSpeed's, upstream's); the engine itself may run in its fp32 mode beside mds-train's
    master weights."""
    derived = derive_deepspeed_config(
        config, topology, pipeline_entries={}, client_optimizer="optimizer" not in user_ds
    )
    return merge_deepspeed_config(derived, user_ds)


def build_client_optimizer(
    config: TrainConfig,
    topology: Topology,
    params: list[dict],
    ds_config: dict[str, Any],
    user_ds: dict[str, Any],
    *,
    module: torch.nn.Module,
    groups: ParallelGroups,
) -> torch.optim.Optimizer | None:
    """Ours, unless the user's DeepSpeed file names one (None: DeepSpeed builds that one)."""
    if "optimizer" in user_ds:
        return None
    if uses_sharded_master_weights(config, topology, user_ds):
        return _sharded_optimizer(config, params, module, groups)
    if uses_own_zero3(config, topology, user_ds):
        return _zero3_optimizer(config, params, module, groups, user_ds)
    return _client_optimizer(
        config,
        params,
        offload=offloads_optimizer(ds_config),
        master_weights=uses_master_weights(config, topology),
    )


def apply_zero3_external_parameters(
    module: torch.nn.Module, ds_config: dict[str, Any], *, is_pipeline: bool
) -> None:
    """ZeRO-3 without pipelining: the LM head reads its weight (the word embeddings, or the
    untied output layer, which has no forward of its own) outside its module's forward, so
    ZeRO-3 must gather it for the whole model's."""
    if is_pipeline or _zero_stage(ds_config) != 3:
        return
    import deepspeed

    deepspeed.zero.register_external_parameter(module, module.gpt.head_weight)


def initialize_engine(
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    params: list[dict],
    ds_config: dict[str, Any],
    groups: ParallelGroups,
    *,
    is_pipeline: bool,
):
    """DeepSpeed's engine; the plain engine with TP > 1 sees our groups through DeepSpeedMPU
    (the pipeline engine takes its own from the PipelineModule)."""
    import deepspeed  # loaded here, after the flags and files were checked

    engine, _, _, _ = deepspeed.initialize(
        model=module,
        optimizer=optimizer,
        model_parameters=params if optimizer is None else None,
        config=ds_config,
        mpu=DeepSpeedMPU(groups) if not is_pipeline and groups.tp_size > 1 else None,
    )
    return engine


def apply_fp32_clipping(
    engine, ds_config: dict[str, Any], groups: ParallelGroups, *, is_pipeline: bool
) -> None:
    """fp32 without ZeRO (DeepSpeed's fp32 clipping path, MasterWeightAdamW's too): clipping
    that counts every parameter once and keeps the norm (gradients.py)."""
    half = ds_config.get("fp16", {}).get("enabled") or ds_config.get("bf16", {}).get("enabled")
    if half or _zero_stage(ds_config):
        return
    model_parallel_group = pipeline_model_parallel_group(engine) if is_pipeline else None
    install_fp32_clipping(
        engine,
        tp_rank=groups.tp_rank,
        model_parallel_group=model_parallel_group or groups.tp_group,
    )


def apply_gradient_reduction_in_backward(
    engine,
    optimizer: torch.optim.Optimizer | None,
    module: torch.nn.Module,
    config: TrainConfig,
    topology: Topology,
    groups: ParallelGroups,
) -> None:
    """MasterWeightAdamW: gradients are accumulated in fp32 and averaged during backward, bucket
    by bucket; DeepSpeed's own all-reduce would flatten and reduce every gradient after backward.
    With one replica and one micro-batch per step there is nothing to accumulate or average: the
    optimizer reads the bf16 gradients after backward (its Triton step as they are, torch's path
    through one foreach cast), where a copy per gradient in backward cost 292 launches and hooks
    per 345M step and, under CUDA graphs, ran on the graphs' side stream beside the GEMMs
    (6.6 ms of kernels per step there; the step went from 89.3 to 87.6 ms eager:
    packages/train/README.md, "Profiling" and "Speed")."""
    if not isinstance(optimizer, (MasterWeightAdamW, ShardedMasterAdamW)):
        return
    one_micro_batch = (
        config.batch.rampup_batch_size is None
        and config.global_batch_size(topology) == config.batch.micro_batch_size
    )
    if topology.data_parallel_size == 1 and one_micro_batch:
        return
    skip_backward_allreduce(engine)
    optimizer.reduce_in_backward(
        [param for param in module.parameters() if param.requires_grad],
        is_last_micro_batch=engine.is_gradient_accumulation_boundary,
        data_parallel_group=groups.dp_group,
        data_parallel_size=groups.dp_size,
        reduce_dtype=torch.bfloat16 if config.precision.grad_reduce_in_bf16 else torch.float32,
    )


def apply_weight_gather_in_forward(optimizer, module: torch.nn.Module) -> None:
    """ZeRO-1/2 (ShardedMasterAdamW, PP = 1): the weights' all-gather after a step overlaps the
    next forward, the embedding, each layer and the final norm waiting for their own buckets
    (the head's weight is the embedding's, or waited for with the final norm's)."""
    if isinstance(optimizer, ShardedMasterAdamW):
        gpt = module.gpt
        optimizer.gather_weights_during_forward([gpt.embedding, *gpt.layers, gpt.final_layernorm])


def apply_single_replica_shortcut(
    engine, ds_config: dict[str, Any], groups: ParallelGroups, *, is_pipeline: bool
) -> None:
    """One replica of the plain engine at ZeRO-0: DeepSpeed would still flatten, "all-reduce" and
    copy back every gradient."""
    if not is_pipeline and groups.dp_size == 1 and _zero_stage(ds_config) == 0:
        skip_backward_allreduce(engine)


def _zero_stage(ds_config: dict[str, Any]) -> int:
    return ds_config["zero_optimization"]["stage"]


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
