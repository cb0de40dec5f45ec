"""The one module that reaches into DeepSpeed's undocumented internals, and the versions checked.

Each function wraps one private attribute, method or monkey-patch that mds-train relies on, with why
it needs it; tests/train/test_deepspeed_contract.py checks each against the installed DeepSpeed,
and packages/train/docs/deepspeed-internals.md lists them (internal, wrapper, why). DeepSpeed's
documented API (`deepspeed.initialize`, the engine's `backward`/`step`/`train_batch`/
`save_checkpoint`/`load_checkpoint`, `get_global_grad_norm`, ...) is used directly elsewhere.
"""

from __future__ import annotations

import os
import types
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from importlib import metadata
from typing import Any

import torch

# The DeepSpeed releases (major.minor) whose internals this module was checked against.
TESTED_VERSIONS = ("0.19",)
# Set to 1 to run on another release anyway (after tests/train/test_deepspeed_contract.py passes).
UNTESTED_OVERRIDE = "MDS_ALLOW_UNTESTED_DEEPSPEED"


def check_version(version: str | None = None, *, environ: dict[str, str] | None = None) -> None:
    """Refuses (ValueError, one line) a DeepSpeed whose major.minor is not in TESTED_VERSIONS;
    `version`: the installed distribution's when None. Read from the package metadata, so the
    refusal comes before DeepSpeed is imported."""
    environ = os.environ if environ is None else environ
    if version is None:
        try:
            version = metadata.version("deepspeed")
        except metadata.PackageNotFoundError:
            raise ValueError("DeepSpeed is not installed; pip install deepspeed==0.19.*") from None
    major_minor = ".".join(version.split(".")[:2])
    if major_minor in TESTED_VERSIONS or environ.get(UNTESTED_OVERRIDE) == "1":
        return
    tested = ", ".join(f"{v}.x" for v in TESTED_VERSIONS)
    raise ValueError(
        f"DeepSpeed {version} is installed; mds-train relies on DeepSpeed internals checked on "
        f"{tested} only: install one of those, or run tests/train/test_deepspeed_contract.py "
        f"against {version} and set {UNTESTED_OVERRIDE}=1 to try it"
    )


def default_process_group_timeout() -> timedelta:
    """`init_distributed`'s own default (`deepspeed.constants.default_pg_timeout`: 10 minutes,
    or DEEPSPEED_TIMEOUT), for runs without --distributed-timeout-minutes."""
    from deepspeed.constants import default_pg_timeout

    return default_pg_timeout


# --- the engine (DeepSpeedEngine, PipelineEngine) ---


def replace_fp32_clipping(engine: Any, clip: Callable[[], torch.Tensor]) -> None:
    """Makes `clip()` the engine's fp32 clipping: `_take_model_step` calls `clip_fp32_gradients`
    before the optimizer step (gradient_clipping > 0, no fp16/bf16, no ZeRO), and its norm
    becomes `get_global_grad_norm()`. mds needs it because DeepSpeed's own counts the pipeline's
    tied embedding copy twice and discards the norm (gradients.py)."""

    def clip_fp32_gradients(self) -> None:
        self._global_grad_norm = clip()

    engine.clip_fp32_gradients = types.MethodType(clip_fp32_gradients, engine)


def skip_backward_allreduce(engine: Any) -> None:
    """`backward` reduces no gradients (`enable_backward_allreduce`): MasterWeightAdamW averages
    them itself during backward, and one replica needs no flatten-reduce-copy of every gradient."""
    engine.enable_backward_allreduce = False


@contextmanager
def writing_zero3_model_file(engine: Any, dp_rank: int, *, enabled: bool = True) -> Iterator[None]:
    """The engine's save writes this rank's model file under DeepSpeed's stage-3 name
    (`zero_pp_rank_D_mp_rank_TT_model_states.pt`, one per data-parallel rank), where its stage-0
    mode (FullyShardedAdamW's engine) writes `mp_rank_TT_model_states.pt` from the first rank
    only: `_get_ckpt_name` and `save_non_zero_checkpoint`, overridden on the instance."""
    if not enabled:
        yield
        return
    from mds_checkpoint import zero3_model_file

    def name(checkpoints_path, tag, mp_placeholder=None, pp_placeholder=None):  # noqa: ARG001
        file = zero3_model_file(dp_rank, engine.checkpoint_mp_rank)
        return os.path.join(checkpoints_path, str(tag), file)

    writes = engine.save_non_zero_checkpoint
    engine._get_ckpt_name, engine.save_non_zero_checkpoint = name, True
    try:
        yield
    finally:
        del engine._get_ckpt_name
        engine.save_non_zero_checkpoint = writes


def built_optimizer(engine: Any) -> torch.optim.Optimizer:
    """The torch optimizer DeepSpeed built from the config's `optimizer` section (before any ZeRO
    or fp16 wrapper): its param groups carry the learning rate the schedule sets."""
    return engine.basic_optimizer


def pipeline_model_parallel_group(engine: Any):
    """The pipeline engine's TP x PP group (its `mpu` is the PipelineModule's grid): the group a
    gradient norm is summed over."""
    return engine.mpu.get_model_parallel_group()


def set_progress(engine: Any, *, iteration: int, consumed_samples: int) -> None:
    """The engine's step and sample counters, as DeepSpeed's own optimizer load sets them, for
    loads that fill the optimizer outside it (reshaped and universal checkpoints)."""
    engine.global_steps = iteration
    engine.global_samples = consumed_samples


@contextmanager
def checkpoint_engine_loading_with(engine: Any, load: Callable[..., Any]) -> Iterator[None]:
    """While inside, DeepSpeed's checkpoint loads read files with `load(path, map_location)`
    (its `checkpoint_engine.load`): upstream's files pickle Megatron classes (rank_files.py)."""
    checkpoint_engine = engine.checkpoint_engine
    original = checkpoint_engine.load
    checkpoint_engine.load = lambda path, map_location=None: load(path, map_location)
    try:
        yield
    finally:
        checkpoint_engine.load = original


def refresh_master_weights(engine: Any) -> None:
    """The optimizer's fp32 masters from the model's weights, where it keeps any
    (`refresh_fp32_params`, which DeepSpeed's module-only load calls too)."""
    refresh = getattr(engine.optimizer, "refresh_fp32_params", None)
    if refresh is not None:
        refresh()


def is_pipeline_engine(engine: Any) -> bool:
    """Whether the engine trains a PipelineModule (whose `tied_modules` hold the shared
    embedding): its parameters are named by layer index."""
    return hasattr(engine.module, "tied_modules")


def replicated_by_pipeline(param: torch.nn.Parameter) -> bool:
    """Whether this is the last stage's copy of a tied parameter (`ds_pipe_replicated`, which
    DeepSpeed's half-precision norms skip): a gradient norm counts it once, on the first stage."""
    return bool(getattr(param, "ds_pipe_replicated", False))


def current_loss_scale(engine: Any) -> float | None:
    """The fp16 optimizer's current loss scale (`cur_scale` of its fp16 wrappers, `loss_scale`
    of its ZeRO optimizers), for the log line; None when it keeps none."""
    optimizer = engine.optimizer
    scale = getattr(optimizer, "cur_scale", None) or getattr(optimizer, "loss_scale", None)
    if scale is None:
        return None
    return float(scale.item() if torch.is_tensor(scale) else scale)


def dynamic_loss_scaler(ds_optimizer: Any) -> Any | None:
    """The optimizer's `DynamicLossScaler` (its `loss_scaler`, `dynamic`), or None (static
    scale, bf16, fp32): a reshaped fp16 checkpoint's scaler state goes into it."""
    scaler = getattr(ds_optimizer, "loss_scaler", None)
    if scaler is None or not getattr(scaler, "dynamic", False):
        return None
    return scaler


def set_loss_scaler_state(scaler: Any, *, cur_scale: float, **counters: int) -> None:
    """The fields a `DynamicLossScaler` changes as it runs (`cur_scale`, `cur_iter`,
    `last_overflow_iter`, `cur_hysteresis`; mds_checkpoint.loss_scale.STATE_FIELDS)."""
    scaler.cur_scale = float(cur_scale)
    for name, value in counters.items():
        if not hasattr(scaler, name):
            raise AttributeError(f"DeepSpeed's loss scaler has no {name}")
        setattr(scaler, name, int(value))


# --- ZeRO-1/2 and the BF16 optimizer: a parameter's fragment of the flat fp32 partition ---


@dataclass(frozen=True)
class Fragment:
    """This DP rank's piece of one parameter in its optimizer's flat fp32 partition."""

    start: int  # where the piece begins in the flattened parameter
    numel: int
    master: torch.Tensor  # its fp32 values (a view into the partition)
    partition_start: int  # where it begins in the partition (and in the Adam moments)
    group_index: int  # the partition's param group in the inner optimizer


def has_fragment_mapping(param: torch.nn.Parameter) -> bool:
    """Whether DeepSpeed's ZeRO-1/2 or BF16 optimizer maps this parameter (`_hp_mapping`, what
    DeepSpeed's universal loader fills)."""
    return hasattr(param, "_hp_mapping")


def fragment_of(param: torch.nn.Parameter) -> Fragment | None:
    """The parameter's fragment (`_hp_mapping`), or None where this DP rank's partition holds
    none of it: reshaped.py writes a reshaped checkpoint's values there."""
    mapping = param._hp_mapping
    if mapping is None:
        return None
    lp = mapping.lp_fragment_address
    hp = mapping.hp_fragment_address
    return Fragment(
        start=lp.start,
        numel=lp.numel,
        master=mapping.hp_fragment,
        partition_start=hp.start,
        group_index=mapping.param_group_index,
    )


def inner_optimizer(ds_optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer a DeepSpeed optimizer wraps (its `optimizer`): its state holds the
    Adam moments of the flat fp32 partitions."""
    return ds_optimizer.optimizer


def relink_optimizer_state(ds_optimizer: Any) -> None:
    """After the inner optimizer's state was replaced, the fragments' views into it are rebuilt
    at the next use (`_hp_optimizer_states_linked`)."""
    if hasattr(ds_optimizer, "_hp_optimizer_states_linked"):
        ds_optimizer._hp_optimizer_states_linked = False


# --- ZeRO-3 (DeepSpeedZeroOptimizer_Stage3): partitioned parameters ---


@dataclass(frozen=True)
class Zero3SubGroup:
    """One sub-group: its parameters' partitions lie end to end in `master` (fp32)."""

    params: list[torch.nn.Parameter]
    master: torch.Tensor
    param_group: dict[str, Any]  # the inner optimizer's group, for its fused/capturable flags


def zero3_keeps_partitions_on_nvme(ds_optimizer: Any) -> bool:
    """Whether the optimizer swaps its partitions to NVMe (`swap_optimizer`, or flat partitions
    that are None): reshaped.py cannot write them there."""
    return bool(getattr(ds_optimizer, "swap_optimizer", False)) or any(
        flat is None for flat in ds_optimizer.fp16_partitioned_groups_flat
    )


def zero3_sub_groups(ds_optimizer: Any) -> list[Zero3SubGroup]:
    """The sub-groups (`fp16_groups`, `fp32_partitioned_groups_flat`, `sub_group_to_group_id`)
    that reshaped.py fills with a reshaped checkpoint's partitions."""
    base = ds_optimizer.optimizer
    return [
        Zero3SubGroup(
            params=list(params),
            master=ds_optimizer.fp32_partitioned_groups_flat[g],
            param_group=base.param_groups[ds_optimizer.sub_group_to_group_id[g]],
        )
        for g, params in enumerate(ds_optimizer.fp16_groups)
    ]


@dataclass(frozen=True)
class Zero3Partition:
    """A parameter's partition: `numel` values from `rank * numel` of its flattened (zero-padded)
    tensor, held in `local` (its `ds_tensor`)."""

    shape: tuple[int, ...]  # the whole parameter's (`ds_shape`)
    rank: int
    world_size: int
    numel: int
    local: torch.Tensor


def zero3_partition(ds_optimizer: Any, param: torch.nn.Parameter) -> Zero3Partition:
    """Where the optimizer keeps this rank's piece of a ZeRO-3 parameter (`ds_shape`,
    `ds_tensor`, `partition_numel`, `_get_param_partition_rank/_world_size`)."""
    return Zero3Partition(
        shape=tuple(param.ds_shape),
        rank=ds_optimizer._get_param_partition_rank(param),
        world_size=ds_optimizer._get_param_partition_world_size(param),
        numel=param.partition_numel(),
        local=param.ds_tensor,
    )


def zero3_full_shape(param: torch.nn.Parameter) -> tuple[int, ...]:
    """A partitioned parameter's whole shape (`ds_shape`; its `shape` is empty)."""
    return tuple(param.ds_shape)


@contextmanager
def zero3_all_partitioned(ds_optimizer: Any) -> Iterator[None]:
    """Inside, every parameter is partitioned and none gathered; after, the persistent ones are
    gathered again (`checkpoint_event_prologue/epilogue`, as DeepSpeed's own checkpoint load)."""
    ds_optimizer.checkpoint_event_prologue()
    yield
    ds_optimizer.checkpoint_event_epilogue()


# --- ZeRO-1/2 partition files as DeepSpeed's own optimizers write them (ShardedMasterAdamW) ---


@dataclass(frozen=True)
class PartitionState:
    """One DP rank's optimizer state in DeepSpeed's ZeRO-1/2 terms, per flat parameter group."""

    base: dict[str, Any]  # the inner torch optimizer's state dict over the fp32 partitions
    partitions: list[torch.Tensor]  # fp32, with their padding
    paddings: list[int]  # this rank's padding elements per group (DeepSpeed's group_paddings)
    dp_size: int
    # per group: (parameter name, elements, start in the partition) of each fragment held
    fragments: list[list[tuple[str, int, int]]]
    param_counts: list[int]  # parameters per group (ZeRO-2 records a padding for each)


def deepspeed_optimizer_state(state: PartitionState, *, stage: int, clip_grad: float) -> dict:
    """The state dict DeepSpeed's BF16 optimizer (`stage` 1: `BF16_Optimizer.state_dict`) or
    its ZeRO optimizer (`stage` 2: `DeepSpeedZeroOptimizer.state_dict`, partitions without their
    padding, no parameter alignment, a static loss scale of 1 as bf16 has) saves, key for key:
    what their `load_state_dict` and mds_checkpoint's optimizer_read read."""
    from deepspeed.checkpoint import constants
    from deepspeed.git_version_info import version
    from deepspeed.utils.tensor_fragment import fragment_address

    saved = {
        constants.CLIP_GRAD: clip_grad,
        constants.BASE_OPTIMIZER_STATE: state.base,
        constants.SINGLE_PARTITION_OF_FP32_GROUPS: state.partitions,
        constants.GROUP_PADDINGS: state.paddings,
        constants.PARTITION_COUNT: [state.dp_size] * len(state.partitions),
        constants.DS_VERSION: version,
        constants.PARAM_SLICE_MAPPINGS: [
            OrderedDict(
                (name, fragment_address(numel=numel, start=start)) for name, numel, start in group
            )
            for group in state.fragments
        ],
    }
    if stage == 1:
        return saved
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    unpadded = [
        partition.narrow(0, 0, partition.numel() - padding)
        for partition, padding in zip(state.partitions, state.paddings, strict=True)
    ]
    return {  # in DeepSpeedZeroOptimizer.state_dict's order
        constants.LOSS_SCALER: LossScaler(scale=1.0),
        "dynamic_loss_scale": False,
        "overflow": False,
        constants.CLIP_GRAD: clip_grad,
        constants.BASE_OPTIMIZER_STATE: state.base,
        constants.SINGLE_PARTITION_OF_FP32_GROUPS: unpadded,
        constants.ZERO_STAGE: ZeroStageEnum.gradients,
        constants.GROUP_PADDINGS: state.paddings,
        constants.PARAM_ALIGNMENT_PADDINGS: [[0] * count for count in state.param_counts],
        constants.PARTITION_COUNT: saved[constants.PARTITION_COUNT],
        constants.DS_VERSION: version,
        constants.PARAM_SLICE_MAPPINGS: saved[constants.PARAM_SLICE_MAPPINGS],
    }


def zero_file_contents(optimizer_state: dict, ds_config: dict | None) -> dict:
    """A `[bf16_]zero_pp_rank_*_optim_states.pt` file's contents, as the engine's
    `_save_zero_checkpoint` writes them."""
    from deepspeed.git_version_info import version

    return {"optimizer_state_dict": optimizer_state, "ds_config": ds_config, "ds_version": version}


@dataclass(frozen=True)
class SavedPartition:
    """What a DeepSpeed ZeRO-1/2 or BF16 optimizer state dict holds for its DP rank."""

    partition_counts: list[int]
    partitions: list[torch.Tensor]  # fp32; ZeRO-1/2's without their padding
    base: Any  # the inner optimizer's state dict (a list of group states when elastic)


def saved_partition(saved: dict) -> SavedPartition:
    from deepspeed.checkpoint import constants

    counts = saved[constants.PARTITION_COUNT]
    partitions = saved[constants.SINGLE_PARTITION_OF_FP32_GROUPS]
    if not isinstance(counts, list):
        counts = [counts] * len(partitions)
    return SavedPartition(counts, partitions, saved[constants.BASE_OPTIMIZER_STATE])


# --- ZeRO-3 partition files as DeepSpeed's stage 3 writes them (FullyShardedAdamW) ---------


@dataclass(frozen=True)
class Zero3State:
    """One DP rank's optimizer state in DeepSpeed's stage-3 terms, per flat sub-group."""

    groups: list[dict[str, Any]]  # each parameter group's options (lr, weight_decay, its keys)
    sub_group_of: list[int]  # the parameter group of each sub-group
    fp32: list[torch.Tensor]  # this rank's partitions of each sub-group's parameters, end to end
    exp_avg: list[torch.Tensor]
    exp_avg_sq: list[torch.Tensor]
    steps: list[int]
    dp_size: int


def zero3_optimizer_state(state: Zero3State, *, betas: tuple[float, float], eps: float) -> dict:
    """The state dict DeepSpeed's stage-3 optimizer saves (`_rigid_state_dict`: a static loss
    scale of 1 as bf16 has, the inner torch AdamW's state over the fp32 sub-group partitions,
    which its `load_state_dict` and mds_checkpoint's zero3 read), key for key."""
    from deepspeed.checkpoint import constants
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    inner = torch.optim.AdamW(
        [
            {
                "params": [
                    f for f, g in zip(state.fp32, state.sub_group_of, strict=True) if g == i
                ],
                **options,
            }
            for i, options in enumerate(state.groups)
        ],
        betas=betas,
        eps=eps,
        fused=False,  # a record: the loading run steps as it was built to
    )
    for flat, exp_avg, exp_avg_sq, step in zip(
        state.fp32, state.exp_avg, state.exp_avg_sq, state.steps, strict=True
    ):
        inner.state[flat] = {
            "step": torch.tensor(float(step)),
            "exp_avg": exp_avg,
            "exp_avg_sq": exp_avg_sq,
        }
    return {  # in _rigid_state_dict's order
        constants.ZERO_STAGE: ZeroStageEnum.weights,
        constants.LOSS_SCALER: LossScaler(scale=1.0),
        "dynamic_loss_scale": False,
        "overflow": False,
        constants.PARTITION_COUNT: state.dp_size,
        constants.OPTIMIZER_STATE_DICT: inner.state_dict(),
        constants.FP32_FLAT_GROUPS: state.fp32,
    }


@dataclass(frozen=True)
class SavedZero3:
    """What a DeepSpeed stage-3 optimizer state dict holds for its DP rank, per sub-group."""

    dp_size: int
    group_count: int  # parameter groups the sub-groups were cut from
    fp32: list[torch.Tensor]
    exp_avg: list[torch.Tensor]
    exp_avg_sq: list[torch.Tensor]
    steps: list[int]


def saved_zero3_state(saved: dict) -> SavedZero3:
    from deepspeed.checkpoint import constants

    fp32 = saved[constants.FP32_FLAT_GROUPS]
    base = saved[constants.OPTIMIZER_STATE_DICT]
    indices = [index for group in base["param_groups"] for index in group["params"]]
    states = [base["state"].get(index, {}) for index in indices]
    if len(states) != len(fp32):
        raise ValueError(
            f"its ZeRO-3 optimizer state covers {len(states)} sub-groups, its partitions "
            f"{len(fp32)}"
        )
    return SavedZero3(
        dp_size=int(saved[constants.PARTITION_COUNT]),
        group_count=len(base["param_groups"]),
        fp32=fp32,
        exp_avg=[s.get("exp_avg", torch.zeros_like(f)) for s, f in zip(states, fp32, strict=True)],
        exp_avg_sq=[
            s.get("exp_avg_sq", torch.zeros_like(f)) for s, f in zip(states, fp32, strict=True)
        ],
        steps=[int(float(s.get("step", 0))) for s in states],
    )
