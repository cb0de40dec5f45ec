"""The model, its optimizer and the DeepSpeed engine, built from the config in a fixed order.

PP > 1 uses DeepSpeed's pipeline engine over `build_gpt_pipe` (ZeRO 0-1); PP = 1 the plain engine
over the GPT (ZeRO 0-3, CPU offload). Parameter groups follow Megatron: no weight decay on biases
and LayerNorm parameters. The optimizer is torch's AdamW (fused on GPUs) unless the user's
DeepSpeed config names one, or DeepSpeed's CPU Adam when the optimizer is offloaded.
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
from .ds_config import (
    derive_deepspeed_config,
    merge_deepspeed_config,
    offloads_optimizer,
    uses_master_weights,
)
from .gradients import install_fp32_clipping
from .master_weights import MasterWeightAdamW

logger = logging.getLogger(__name__)


class TrainingGPT(torch.nn.Module):
    """The GPT that the plain engine (PP = 1) trains, as upstream's `GPTModel` presents itself:

    - forward is the masked mean loss (DeepSpeed's engine calls forward; ZeRO-3 gathers
      parameters in the submodules' forward hooks);
    - the GPT's modules are registered under Megatron's nesting (`language_model.embedding`,
      `language_model.encoder.layers.I`, `language_model.encoder.final_layernorm`), so DeepSpeed's
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
        # It computes with the modules registered above; registering it as well would name each
        # parameter twice.
        object.__setattr__(self, "gpt", gpt)

    def forward(self, tokens, labels, loss_mask):  # noqa: D102 - (B, S) x3 -> scalar
        return masked_mean(self.gpt(tokens, labels), loss_mask)

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # noqa: D102
        from mds_checkpoint.engine_names import megatron_nested

        return megatron_nested(self.gpt.state_dict(*args, **kwargs))

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True, assign=False):  # noqa: D102
        from mds_checkpoint.engine_names import megatron_flat

        flat = megatron_flat(state_dict) if "language_model" in state_dict else state_dict
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
    ds_config: dict[str, Any]
    is_pipeline: bool


def parameter_groups(module: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Megatron's `_get_params_for_weight_decay_optimization`: norms and biases get no decay.

    In the GPT those are exactly the 1-D parameters; embeddings and linear weights are 2-D.
    """
    decay, no_decay = [], []
    for param in module.parameters():  # tied parameters come once
        if param.requires_grad:
            (no_decay if param.dim() < 2 else decay).append(param)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return [group for group in groups if group["params"]]


def _client_optimizer(
    config: TrainConfig, params: list[dict], *, offload: bool, master_weights: bool
):
    opt = config.optimizer
    if opt.optimizer == "sgd":
        return torch.optim.SGD(params, lr=0.0, momentum=opt.sgd_momentum)
    betas = (opt.adam_beta1, opt.adam_beta2)
    if master_weights:
        return MasterWeightAdamW(params, betas=betas, eps=opt.adam_eps)
    if offload:
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(params, lr=0.0, betas=betas, eps=opt.adam_eps, adamw_mode=True)
    fused = torch.cuda.is_available()
    return torch.optim.AdamW(params, lr=0.0, betas=betas, eps=opt.adam_eps, fused=fused)


def build_training_setup(
    config: TrainConfig, topology: Topology, gpt_config: GPTConfig, user_ds: dict[str, Any]
):
    """`user_ds`: the user's DeepSpeed file, already folded into `config` (ds_file.py)."""
    import deepspeed  # loaded here, after the flags and files were checked
    from mds_model import build_gpt_pipe, pipeline_deepspeed_config

    seed = config.precision.seed
    groups = ParallelGroups.build(
        tensor_parallel_size=topology.tensor_parallel,
        pipeline_parallel_size=topology.pipeline_parallel,
    )
    random.seed(seed)
    np.random.seed(seed)
    tracker = model_parallel_seed(seed, tp_rank=groups.tp_rank, pp_rank=groups.pp_rank)
    is_pipeline = topology.pipeline_parallel > 1
    if is_pipeline:
        module = build_gpt_pipe(gpt_config, groups=groups, rng_tracker=tracker, init_seed=seed)
    else:
        module = TrainingGPT(gpt_config, groups=groups, rng_tracker=tracker, init_seed=seed)
    if torch.cuda.is_available():
        module = module.cuda()

    client = "optimizer" not in user_ds
    derived = derive_deepspeed_config(
        config,
        topology,
        pipeline_entries=pipeline_deepspeed_config(gpt_config) if is_pipeline else {},
        client_optimizer=client,
    )
    ds_config = merge_deepspeed_config(derived, user_ds)
    params = parameter_groups(module, config.optimizer.weight_decay)
    optimizer = None
    if client:
        optimizer = _client_optimizer(
            config,
            params,
            offload=offloads_optimizer(ds_config),
            master_weights=uses_master_weights(config, topology),
        )
    if not is_pipeline and ds_config["zero_optimization"]["stage"] == 3:
        # The LM head reads the word embeddings outside their module's forward.
        deepspeed.zero.register_external_parameter(
            module, module.gpt.embedding.word_embeddings.weight
        )
    engine, _, _, _ = deepspeed.initialize(
        model=module,
        optimizer=optimizer,
        model_parameters=params if optimizer is None else None,
        config=ds_config,
        mpu=DeepSpeedMPU(groups) if not is_pipeline and groups.tp_size > 1 else None,
    )
    half = ds_config.get("fp16", {}).get("enabled") or ds_config.get("bf16", {}).get("enabled")
    if not (half or ds_config["zero_optimization"]["stage"]):  # DeepSpeed's fp32 clipping path
        model_parallel_group = engine.mpu.get_model_parallel_group() if is_pipeline else None
        install_fp32_clipping(
            engine,
            tp_rank=groups.tp_rank,
            model_parallel_group=model_parallel_group or groups.tp_group,
        )
    if isinstance(optimizer, MasterWeightAdamW):
        # Gradients are accumulated in fp32 and averaged during backward, bucket by bucket;
        # DeepSpeed's own all-reduce would flatten and reduce every gradient after backward.
        engine.enable_backward_allreduce = False
        optimizer.reduce_in_backward(
            [param for param in module.parameters() if param.requires_grad],
            is_last_micro_batch=engine.is_gradient_accumulation_boundary,
            data_parallel_group=groups.dp_group,
            data_parallel_size=groups.dp_size,
            reduce_dtype=torch.bfloat16 if config.precision.grad_reduce_in_bf16 else torch.float32,
        )
    elif not is_pipeline and groups.dp_size == 1 and ds_config["zero_optimization"]["stage"] == 0:
        # One replica: DeepSpeed would still flatten, "all-reduce" and copy back every gradient.
        engine.enable_backward_allreduce = False
    base_optimizer = optimizer or engine.basic_optimizer  # DeepSpeed built it from the file
    return TrainingSetup(
        engine=engine,
        optimizer=base_optimizer,
        groups=groups,
        rng_tracker=tracker,
        gpt_config=gpt_config,
        ds_config=ds_config,
        is_pipeline=is_pipeline,
    )


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
