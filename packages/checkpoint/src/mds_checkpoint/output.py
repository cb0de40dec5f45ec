"""The output side shared by the reshaper and import-hf: target checks, the save folder, meta.json.

The output is a save folder holding `latest` and one `global_stepN` tag, described by a meta.json
in mds-train's format (so `mds-train --load OUT` reads it) with a `reshaped` record of where it
came from and an `optimizer` record (`null`, or the universal layout's step and, from an fp16
run, its dynamic loss scaler).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mds_common.sidecar import distribution_version
from mds_model import GPTConfig

from .consolidate import single_rank_config
from .layout import LATEST, MEGATRON_TRACKER, META, tracker_tag
from .meta import CheckpointMeta, Parallel, meta_text, model_fields

TOOL = "mds-merge-mp"
DISTRIBUTION = "mds-checkpoint"


def target_config(
    config: GPTConfig, *, tensor_model_parallel_size: int, pipeline_model_parallel_size: int
) -> GPTConfig:
    """The model split over the target TP; ValueError when T does not divide heads or the
    vocabulary, or P the layers."""
    try:
        target = single_rank_config(config, tensor_model_parallel_size)
    except ValueError as error:
        raise ValueError(
            f"--target-tensor-model-parallel-size {tensor_model_parallel_size}: {error}"
        ) from None
    if config.num_layers % pipeline_model_parallel_size:
        raise ValueError(
            f"--target-pipeline-model-parallel-size {pipeline_model_parallel_size} does not divide "
            f"num_layers ({config.num_layers}) into equal stages"
        )
    return target


def check_save_folder(save: Path) -> None:
    """An existing --save folder is replaced only when mds-merge-mp wrote it."""
    if not save.exists():
        return
    if not save.is_dir():
        raise ValueError(f"--save {save}: exists and is not a folder")
    entries = list(save.iterdir())
    if not entries:
        return
    for pointer in (save / LATEST, save / MEGATRON_TRACKER):  # an earlier output's tag
        if not pointer.is_file():
            continue
        tag = pointer.read_text().strip()
        if pointer.name == MEGATRON_TRACKER:
            tag = tracker_tag(tag)
        try:
            if json.loads((save / tag / META).read_text()).get("tool") == TOOL:
                return
        except (OSError, json.JSONDecodeError):
            pass  # not an output of ours
    raise ValueError(
        f"--save {save}: folder exists and was not written by {TOOL}; choose a new folder"
    )


def output_meta(
    base: CheckpointMeta,
    config: GPTConfig,
    *,
    tensor_model_parallel_size: int,
    pipeline_model_parallel_size: int,
    tag: str,
    reshaped: dict[str, Any],
    optimizer: dict[str, Any] | None,
    layout: str = "mds",
) -> CheckpointMeta:
    """meta.json of the output: the source's description with this model, topology and records."""
    tp = tensor_model_parallel_size
    return base.replace(
        tool=TOOL,
        version=distribution_version(DISTRIBUTION),
        versions={name: distribution_version(name) for name in ("mds-model", "deepspeed", "torch")},
        model=model_fields(config),
        parallel=Parallel(
            world_size=tp * pipeline_model_parallel_size,
            tensor_model_parallel_size=tp,
            pipeline_model_parallel_size=pipeline_model_parallel_size,
            data_parallel_size=1,
            zero_stage=0,
            engine=_engine(layout, pipeline_model_parallel_size),
        ),
        precision=config.params_dtype,
        tag=tag,
        layout=layout,
        reshaped=reshaped,
        optimizer=optimizer,
    )


def _engine(layout: str, pipeline_model_parallel_size: int) -> str:
    """Which engine's files hold the weights: DeepSpeed's pipeline (layer files; bigscience's fork
    runs it at any PP) or plain engine, or none (plain Megatron's model_optim_rng.pt)."""
    if layout == "megatron":
        return "megatron"
    return "pipeline" if pipeline_model_parallel_size > 1 or layout == "bigscience" else "plain"


def write_meta(folder: Path, meta: CheckpointMeta) -> None:
    (folder / META).write_text(meta_text(meta))
