"""`mds-merge-mp`: any checkpoint to an mds-train checkpoint at another (TP, PP), streamed.

One part at a time (embedding, each transformer layer, final norm, an untied output layer): read
the part's shards from every source rank (memory-mapped), join them, check replicated copies agree,
split for the target and write; with `--with-optimizer` the same part's fp32 masters and Adam
moments go to DeepSpeed's universal layout (`universal.py`), in folders named as the target's
engine names the parameters, with `latest_universal` beside `latest`. Peak memory is about one
layer across all source ranks plus its output. The output folder appears complete or not at all
(`atomic_directory`).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from mds_common.progress import Meter, eta_seconds, format_duration

from . import universal
from .config import ReshapeConfig
from .consolidate import consolidate
from .engine_names import engine_parameter_name
from .layout import LATEST_UNIVERSAL, tag_for
from .optimizer_read import OptimizerState
from .output import (
    check_save_folder,
    output_meta,
    target_config,
    write_meta,
)
from .partition import BufferPool
from .source import Source, merged_part, open_source
from .writer import new_save_folder, write_trackers

if TYPE_CHECKING:  # the model and its kernels load only with --verify
    from .verify import Verification

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReshapeResult:
    folder: Path  # OUT/global_stepN
    num_tensors: int
    num_bytes: int
    seconds: float
    verification: Verification | None  # with --verify


def reshape(config: ReshapeConfig) -> ReshapeResult:
    start = time.perf_counter()
    source = open_source(config.load, iteration=config.iteration)
    target = target_config(
        source.config,
        tensor_model_parallel_size=config.target_tensor_model_parallel_size,
        pipeline_model_parallel_size=config.target_pipeline_model_parallel_size,
    )
    check_save_folder(config.save)
    tag = tag_for(source.iteration, config.target_layout)
    num_tensors = num_bytes = 0
    verification = None
    with new_save_folder(
        config.save,
        tag,
        config=target,
        tensor_model_parallel_size=config.target_tensor_model_parallel_size,
        pipeline_model_parallel_size=config.target_pipeline_model_parallel_size,
        layout=config.target_layout,
    ) as (staging, writer):
        folder = writer.folder
        current: dict[str, np.ndarray] = {}
        optimizer = None
        if config.with_optimizer:
            optimizer = OptimizerState(source, lambda name: current[name])
        parts = source.parts()
        meter = Meter(logger=logger)
        # One part is written (a thread: numpy's copies and file writes release the GIL) while
        # the next is read and joined; at most two parts are in memory, and a written part's
        # buffers are joined into again two parts later.
        buffers = BufferPool()
        with ThreadPoolExecutor(max_workers=1) as background:
            writing: dict[str, np.ndarray] = {}
            pending = None
            for number, part in enumerate(parts, start=1):
                current = merged_part(source, part, buffers=buffers)
                if pending is not None:
                    pending.result()
                    buffers.give_back(writing.values())
                pending = background.submit(writer.write_part, current)
                writing = current
                if optimizer is not None:
                    for name in current:
                        paths = universal.write_parameter(
                            folder,
                            name,
                            optimizer.read(name),
                            config=target,
                            rows=target.padded_vocab_size,
                            step=optimizer.step,
                            engine_name=engine_parameter_name(
                                name,
                                num_layers=target.num_layers,
                                pipeline=config.target_pipeline_model_parallel_size > 1,
                                untied=target.untie_embeddings_and_output_weights,
                            ),
                        )
                        writer.written(paths)
                num_tensors += len(current)
                num_bytes += sum(t.nbytes for t in current.values())
                _show_progress(meter, number, len(parts), num_bytes)
            if pending is not None:
                pending.result()
            meter.close()
        current = {}
        writer.finish(
            source.meta.progress.to_dict(),
            tokenizer=source.meta.tokenizer_record(),
            lr_schedule=source.meta.lr_schedule,
        )
        optimizer_record = None
        if optimizer is not None:
            universal.write_global_state(
                folder, step=optimizer.step, param_groups=optimizer.hyperparameters
            )
            optimizer_record = {"layout": "universal", "folder": universal.FOLDER}
            optimizer_record["step"] = optimizer.step
            if optimizer.loss_scaler is not None:  # fp16: the scale goes on where it was
                optimizer_record["loss_scaler"] = optimizer.loss_scaler
        meta = output_meta(
            source.meta,
            target,
            tensor_model_parallel_size=config.target_tensor_model_parallel_size,
            pipeline_model_parallel_size=config.target_pipeline_model_parallel_size,
            tag=tag,
            reshaped=_provenance(source),
            optimizer=optimizer_record,
            layout=config.target_layout,
        )
        write_meta(folder, meta)
        write_trackers(staging, layout=config.target_layout, tag=tag, iteration=source.iteration)
        if optimizer is not None:  # DeepSpeed's load_universal reads its tag from here
            (staging / LATEST_UNIVERSAL).write_text(tag)
        if config.verify:
            from .verify import verify  # the model and its Triton kernels: only here

            verification = verify(consolidate(source), consolidate(open_source(folder)))
    return ReshapeResult(
        folder=config.save / tag,
        num_tensors=num_tensors,
        num_bytes=num_bytes,
        seconds=time.perf_counter() - start,
        verification=verification,
    )


def _show_progress(meter: Meter, done: int, total: int, num_bytes: int) -> None:
    """A bar on a terminal, a log line every 10 s otherwise (SLURM logs)."""
    if not (meter.draw_due() or meter.log_due()):
        return
    elapsed = meter.elapsed()
    eta = format_duration(eta_seconds(elapsed=elapsed, fraction=done / total)) if done else "?"
    text = (
        f"{done}/{total} parts, {num_bytes / 2**20:,.0f} MiB, "
        f"{num_bytes / 2**20 / elapsed:,.0f} MiB/s, ETA {eta}"
    )
    if meter.interactive:
        meter.draw(done / total, text, label="reshape")
    else:
        logger.info("reshape: %s", text)


def _provenance(source: Source) -> dict:
    return {
        "from": str(source.folder.resolve()),
        "layout": source.layout,
        "tensor_model_parallel_size": source.tensor_model_parallel_size,
        "pipeline_model_parallel_size": source.pipeline_model_parallel_size,
        "rng_states": False,  # per-rank RNG states do not carry over to another topology
    }
