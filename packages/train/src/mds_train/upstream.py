"""`--load` of a checkpoint that Megatron-DeepSpeed or Megatron wrote (no meta.json), or that
mds-merge-mp wrote in another `--target-layout`.

deepspeedai/Megatron-DeepSpeed's own DeepSpeed files at this run's TP and PP (and, when its
optimizer state is loaded, its ZeRO stage and DP size) are what mds-train writes itself, so
DeepSpeed's engine loads them as they are (`loadable_as_is`): weights, ZeRO partitions, and the
client state's progress, scheduler and RNG states (`rng_state`). Anything else is converted once
to this run's TP/PP by mds_checkpoint's reshape, with its optimizer state when it is to be loaded,
then loaded as any mds-merge-mp output is (weights, topology-free Adam state, iteration, consumed
samples and tokens). Upstream's own resume at the same topology is what either must equal.

The conversion goes into `{save}/.upstream-{tag}` (a folder every rank can read: the save folder
is one by necessity) and is removed once loaded. Its meta.json carries the source's scheduler
state as the reshape reads it (`lr_schedule`: upstream's `lr_scheduler` or Megatron's
`opt_param_scheduler` dict, progress included), which scheduler_record.py checks against the
flags and `scheduler_record.scheduler_progress` turns into the run's schedule counters.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from mds_checkpoint import LATEST, MDS_LAYOUT, UPSTREAM_LAYOUT, CheckpointMeta, read_meta

logger = logging.getLogger(__name__)

CONVERTED_PREFIX = ".upstream-"


def needs_conversion(meta: CheckpointMeta | None) -> bool:
    """No meta.json (upstream's own files), or mds-merge-mp's output in another `--target-layout`
    than mds-train's own, whose names DeepSpeed's loader would not find."""
    return meta is None or meta.layout != MDS_LAYOUT


def loadable_as_is(
    folder: Path,
    *,
    tensor_model_parallel_size: int,
    pipeline_model_parallel_size: int,
    data_parallel_size: int,
    zero_stage: int,
    loads_optimizer: bool,
) -> CheckpointMeta | None:
    """The description of an upstream DeepSpeed checkpoint this run's engine
    loads as it is, or None when it must be converted: another TP or PP; a pipeline checkpoint
    at PP = 1 (mds-train runs the plain engine there); query/key/value rows not per head
    (checkpoint_version < 2, or FPDT's blocks); or, when the optimizer is loaded, ZeRO
    partitions for another stage or DP size."""
    from mds_checkpoint import open_source
    from mds_model.naming import QKV_PER_HEAD

    source = open_source(folder)
    if (
        source.layout not in ("plain", "pipeline")
        or (source.layout == "pipeline") != (pipeline_model_parallel_size > 1)
        or source.qkv_order != QKV_PER_HEAD
        or (source.tensor_model_parallel_size, source.pipeline_model_parallel_size)
        != (tensor_model_parallel_size, pipeline_model_parallel_size)
    ):
        return None
    # The ZeRO stage and DP size its rank files say (source.megatron_meta).
    saved = source.meta.parallel
    parallel = dataclasses.replace(saved, data_parallel_size=saved.data_parallel_size or 1)
    if loads_optimizer and (parallel.zero_stage, parallel.data_parallel_size) != (
        zero_stage,
        data_parallel_size,
    ):
        return None
    return source.meta.replace(parallel=parallel, layout=UPSTREAM_LAYOUT)


def converted_folder(save_dir: Path, source: Path) -> Path:
    return save_dir / f"{CONVERTED_PREFIX}{source.name}"


def convert_upstream(
    source: Path,
    *,
    save_dir: Path | None,
    tensor_model_parallel_size: int,
    pipeline_model_parallel_size: int,
    with_optimizer: bool,
    rank: int,
    barrier: Callable[[], None],
) -> tuple[Path, CheckpointMeta]:
    """Rank 0 converts `source` (one checkpoint folder) while the others wait; every rank gets
    the converted checkpoint folder and its meta.json."""
    if save_dir is None:
        raise ValueError(
            f"{source}: a Megatron-DeepSpeed checkpoint is converted into the --save folder "
            "before it loads; give --save"
        )
    base = converted_folder(save_dir, source)
    if rank == 0:
        from mds_checkpoint import ReshapeConfig
        from mds_checkpoint import reshape_checkpoint as reshape

        shutil.rmtree(base, ignore_errors=True)  # left by a run killed while converting
        config = ReshapeConfig(
            load=source,
            save=base,
            target_tensor_model_parallel_size=tensor_model_parallel_size,
            target_pipeline_model_parallel_size=pipeline_model_parallel_size,
            with_optimizer=with_optimizer,
        )
        result = reshape(config)  # its meta.json carries the source's lr_schedule
        logger.info(
            "%s is not in mds-train's layout: converted it to TP=%d PP=%d%s in %.1f s",
            source,
            tensor_model_parallel_size,
            pipeline_model_parallel_size,
            " with its optimizer state" if with_optimizer else "",
            result.seconds,
        )
    barrier()
    folder = base / (base / LATEST).read_text().strip()
    return folder, read_meta(folder)


def remove_converted(folder: Path, *, rank: int, barrier: Callable[[], None]) -> None:
    """Once every rank has loaded it, the conversion goes."""
    barrier()
    if rank == 0 and folder.parent.name.startswith(CONVERTED_PREFIX):
        shutil.rmtree(folder.parent, ignore_errors=True)
