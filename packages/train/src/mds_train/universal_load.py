"""`--universal-checkpoint --load DIR`: resuming from DeepSpeed's universal checkpoint as
upstream Megatron-DeepSpeed does, at any TP, PP and DP.

The tag comes from `DIR/latest_universal` (DeepSpeed's engine `load_checkpoint`; written by
ds_to_universal beside its output folder and by mds-merge-mp --with-optimizer), or DIR is the
checkpoint folder itself. Its `zero/` folder holds each parameter's whole fp32 master, Adam
moments and step (mds_checkpoint.universal). Where this run's optimizer is one of DeepSpeed's
ZeRO-1/2 or BF16 optimizers, DeepSpeed's own universal loader fills it (the DeepSpeed config's
`checkpoint.load_universal`, as upstream's `--universal-checkpoint` sets it; ds_config.py) and
the weights follow from the masters (`update_lp_params`). DeepSpeed's loader restores nothing
else (torch's AdamW at ZeRO-0, whose parameters are the masters; MasterWeightAdamW; ZeRO-3 in
mds's layout), so there reshaped.py puts the same files' values in place. The progress is the
mp_rank file's (mds-train's record, else upstream's `iteration` / `args`); RNG states do not
carry over to another topology.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from mds_checkpoint import CLIENT_KEY, CheckpointMeta, read_meta

from .checkpointing import (
    SHAPE_FIELDS,
    CheckpointContext,
    check_model_fields,
    check_tokenizer,
)
from .deepspeed_engine import set_progress
from .rank_files import load_rank_file, unpickling_foreign_classes
from .reshaped import restore_loss_scaler, restore_optimizer_state, restore_zero3
from .state import TrainingState

logger = logging.getLogger(__name__)


def find_universal_checkpoint(load_dir: Path) -> tuple[Path, dict[str, Any]]:
    """The universal checkpoint folder `--load` names and its description (meta.json, or one
    built from its mp_rank files where ds_to_universal wrote it)."""
    from mds_checkpoint import LATEST_UNIVERSAL, universal_meta
    from mds_checkpoint import UNIVERSAL_FOLDER as FOLDER
    from mds_checkpoint import UNIVERSAL_GLOBAL_STATE as GLOBAL_STATE

    pointer = load_dir / LATEST_UNIVERSAL
    if pointer.is_file():
        tag = pointer.read_text().strip()
        path = load_dir / tag
        if not tag or not path.is_dir():
            raise ValueError(
                f"{pointer}: names {tag!r}, which is not a folder in {load_dir}; write the name "
                "of a universal checkpoint folder into it, or give that folder to --load"
            )
    elif (load_dir / FOLDER / GLOBAL_STATE).is_file():
        path = load_dir
    else:
        raise ValueError(
            f"{load_dir}: --universal-checkpoint finds no {LATEST_UNIVERSAL} there and no "
            f"{FOLDER}/{GLOBAL_STATE} in it; give the folder DeepSpeed's ds_to_universal or "
            "mds-merge-mp --with-optimizer wrote (or that checkpoint folder), or drop "
            "--universal-checkpoint"
        )
    if not (path / FOLDER / GLOBAL_STATE).is_file():
        raise ValueError(f"{path}: no {FOLDER}/{GLOBAL_STATE}; not a universal checkpoint")
    return path, read_meta(path) or universal_meta(path)


def check_universal_compatible(
    meta: CheckpointMeta, run_meta: CheckpointMeta, path: Path, *, tokenizer_change_allowed: bool
) -> None:
    """The model's shape and its tokenizer must agree: TP, PP, DP and the vocabulary padding are
    the loader's (DeepSpeed's and reshaped.py alike cut and pad every parameter for this run)."""
    check_model_fields(meta, run_meta, SHAPE_FIELDS, path)
    check_tokenizer(meta, run_meta, path, change_allowed=tokenizer_change_allowed)


def load_universal(
    context: CheckpointContext,
    found: tuple[Path, CheckpointMeta],
    *,
    deepspeed_loads: bool,
    num_layers: int,
) -> TrainingState:
    """Weights, optimizer state and progress from the universal checkpoint; `deepspeed_loads`:
    the engine was built with `checkpoint.load_universal` (ds_config.deepspeed_loads_universal)."""
    path, meta = found
    engine = context.engine
    if deepspeed_loads:
        _check_engine_names(engine, path)
        with unpickling_foreign_classes(engine):
            _, client_state = engine.load_checkpoint(
                str(path.parent),
                tag=path.name,
                load_optimizer_states=True,
                load_lr_scheduler_states=False,
                load_module_only=False,
            )
        how = "DeepSpeed's universal loader"
    elif context.meta.parallel.zero_stage == 3:
        client_state = restore_zero3(
            engine, context.groups, path, num_layers=num_layers, with_optimizer=True
        )
        how = "the ZeRO-3 partitions (reshaped.py)"
    else:
        restore_optimizer_state(
            engine, context.optimizer, context.groups, path, num_layers=num_layers
        )
        client_state = _client_state(path)
        how = "reshaped.py"
    state = _progress(client_state or {}, meta)
    set_progress(engine, iteration=state.iteration, consumed_samples=state.consumed_train_samples)
    record = (meta.optimizer or {}).get("loss_scaler")
    if restore_loss_scaler(engine.optimizer, record):
        logger.info("fp16 loss scale %s restored", record["cur_scale"])
    logger.warning(
        "%s is a universal checkpoint: per-rank RNG states do not carry over to another "
        "topology; dropout and other random draws continue from the seed",
        path,
    )
    logger.info(
        "resumed from universal checkpoint %s at iteration %d (weights and optimizer state "
        "through %s)",
        path,
        state.iteration,
        how,
    )
    return state


def _check_engine_names(engine: Any, path: Path) -> None:
    """DeepSpeed's loader opens `zero/<the engine's parameter name>` and fails on an assert when
    it is not there (a universal checkpoint of the other engine: plain vs pipeline), and without
    naming the file when one of its state files is missing or cut short."""
    from mds_checkpoint import UNIVERSAL_FOLDER as FOLDER
    from mds_checkpoint import check_parameter_files

    for name, _ in engine.module.named_parameters():
        folder = path / FOLDER / name
        if not folder.is_dir():
            raise ValueError(
                f"{path / FOLDER}: no folder {name}, the name this run's DeepSpeed engine gives "
                "the parameter (the checkpoint names the other engine's parameters: pipeline "
                "for PP > 1, plain for PP = 1); run with --zero-stage 0, or reshape it with "
                "mds-merge-mp --with-optimizer to this run's PP"
            )
        check_parameter_files(folder, name)


def _client_state(path: Path) -> dict[str, Any]:
    """The first mp_rank file's keys (progress: every rank's are the same)."""
    from mds_checkpoint import MP_RANK_FILE

    files = sorted(p for p in path.iterdir() if MP_RANK_FILE.fullmatch(p.name))
    return load_rank_file(files[0], mmap=True)


def _progress(client_state: dict[str, Any], meta: CheckpointMeta) -> TrainingState:
    """mds-train's progress record, else upstream's (`iteration`, consumed samples and tokens,
    as the description read them from `args`)."""
    record = client_state.get(CLIENT_KEY)
    if isinstance(record, dict) and "state" in record:
        return TrainingState.from_dict(record["state"])
    return TrainingState.from_dict(meta.progress.to_dict())
