"""Writing a checkpoint at a target (TP, PP) in one of four layouts, one model part at a time.

- "deepspeedai" (deepspeedai/Megatron-DeepSpeed): PP > 1, DeepSpeed's pipeline files
  `layer_XX-model_YY-model_states.pt` per GPTModelPipe index (its numbering) and TP rank, and one
  `mp_rank_MM_model_states.pt` per (stage, TP rank) with `module` None (MM = stage * TP + tp);
  PP = 1, the plain engine's `mp_rank_YY_model_states.pt` with Megatron's nested state dict under
  `module` (`engine_names.megatron_nested`).
- "mds" (mds-train's own): deepspeedai's files, with mds-train's progress record beside.
- "bigscience" (bigscience-workshop/Megatron-DeepSpeed, which always runs GPTModelPipe): layer
  files in its numbering at any PP.
- "megatron" (plain Megatron): `mp_rank_TT[_PPP]/model_optim_rng.pt` with the nested `model`,
  stage-local layer numbers, and the last stage's `word_embeddings_for_head` when PP > 1.
Every rank file carries upstream's client state (`upstream_state.py`), the DeepSpeed layouts the
keys DeepSpeed's loader reads, "mds" also mds-train's progress (`mds_train.state`). Streamed
files (`ptfile.StreamingSave`) get their tensors as parts arrive and their pickle at `finish`.
Tensors are numpy arrays (`arrays.py`). What is written goes to disk in the background as the
next parts are made (`writeback.py`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from mds_common.files import atomic_directory, reporting_write_failures
from mds_common.sidecar import distribution_version
from mds_common.tokenizer_record import TokenizerRecord
from mds_model import GPTConfig
from mds_model.naming import WORD_EMBEDDINGS, layer_of

from . import ptfile
from .config import TARGET_LAYOUTS as LAYOUTS
from .engine_names import megatron_nested, pipeline_file_key
from .layout import (
    CLIENT_KEY,
    CLIENT_VERSION,
    LATEST,
    MEGATRON_FILE,
    MEGATRON_RELEASE,
    MEGATRON_TRACKER,
)
from .partition import split_whole
from .upstream_state import upstream_keys
from .writeback import WriteBack

_NUMBERING = {"mds": "deepspeedai", "deepspeedai": "deepspeedai", "bigscience": "bigscience"}
HEAD_COPY = "word_embeddings_for_head"  # Megatron's last-stage copy of the tied embedding


def write_trackers(save: Path, *, layout: str, tag: str, iteration: int) -> None:
    """The save folder's pointers, as each writer leaves them: DeepSpeed's `latest` (the tag) and
    Megatron's `latest_checkpointed_iteration.txt` (the iteration, or `release`), which
    deepspeedai's save_checkpoint writes beside DeepSpeed's and plain Megatron alone."""
    if layout != "megatron":
        (save / LATEST).write_text(tag)
    if layout in ("deepspeedai", "megatron"):
        (save / MEGATRON_TRACKER).write_text(tag if tag == MEGATRON_RELEASE else str(iteration))


# GPTConfig fields bigscience's fork has no argument for, with the value it always builds.
_BIGSCIENCE_FIXED = {
    "normalization": "layernorm",
    "num_query_groups": None,
    "add_bias_linear": True,
    "untie_embeddings_and_output_weights": False,
    "rotary_percent": 1.0,
}


def _check_bigscience_builds(config: GPTConfig) -> None:
    """bigscience's GPTModelPipe builds LayerNorm, biased linears, tied embeddings, full rotary,
    no grouped-query attention and its own GLU order: a model outside that is refused."""
    for name, value in _BIGSCIENCE_FIXED.items():
        if getattr(config, name) != value:
            raise ValueError(
                f"--target-layout bigscience: the model has {name}={getattr(config, name)!r}, "
                f"which bigscience's fork does not build ({value!r} there); choose deepspeedai"
            )
    if config.gated:
        raise ValueError(
            f"--target-layout bigscience: the model's {config.activation} MLP is written by "
            "deepspeedai's --swiglu ([gate; up] per rank); choose deepspeedai"
        )


class CheckpointWriter:
    """`write_part(tensors)` for every part (embedding, layers, final norm), then `finish`;
    `written(paths)` hands other files written beside them (optimizer state) to the write-back.
    Used as a context manager: an error ends the open files and the write-back at once (the
    caller removes the folder), not in some finalizer later."""

    def __init__(
        self,
        folder: Path,
        *,
        config: GPTConfig,
        tensor_model_parallel_size: int,
        pipeline_model_parallel_size: int,
        layout: str = "mds",
    ) -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"--target-layout {layout}: choose one of {', '.join(LAYOUTS)}")
        if layout == "bigscience":
            _check_bigscience_builds(config)
        self.folder, self.config, self.pp, self.layout = (
            folder,
            config,
            pipeline_model_parallel_size,
            layout,
        )
        self.tp = tensor_model_parallel_size
        folder.mkdir(parents=True, exist_ok=True)
        # layer files (DeepSpeed's pipeline engine), else one streamed file per (tp, stage)
        self.layer_files = layout == "bigscience" or (layout != "megatron" and self.pp > 1)
        self._streams: dict[tuple[int, int], ptfile.StreamingSave] = {}
        self._modules: dict[tuple[int, int], dict[str, Any]] = {}
        self._write_back = WriteBack()
        if not self.layer_files:
            stages = self.pp if layout == "megatron" else 1
            for stage in range(stages):
                for tp in range(self.tp):
                    path = self._stream_path(tp, stage)
                    path.parent.mkdir(exist_ok=True)
                    self._streams[(tp, stage)] = ptfile.StreamingSave(path)
                    self._modules[(tp, stage)] = {}

    def _stream_path(self, tp: int, stage: int) -> Path:
        if self.layout != "megatron":
            return self.folder / f"mp_rank_{tp:02d}_model_states.pt"
        # Megatron's get_checkpoint_name: the pipeline rank only when PP > 1
        rank = f"mp_rank_{tp:02d}" if self.pp == 1 else f"mp_rank_{tp:02d}_{stage:03d}"
        return self.folder / rank / MEGATRON_FILE

    def _stages_of(self, name: str) -> list[int]:
        """The pipeline stages (of a streamed layout) whose file holds a parameter: the first
        has the embedding (Megatron's last stage also a copy for the head), the last the final
        norm, stage s the layers from s x L / P."""
        if self.layout != "megatron" or self.pp == 1:
            return [0]
        layer = layer_of(name)
        if layer is not None:
            return [layer[0] // (self.config.num_layers // self.pp)]
        if name == WORD_EMBEDDINGS and not self.config.untie_embeddings_and_output_weights:
            return [0, self.pp - 1]
        return [0] if name.startswith("embedding.") else [self.pp - 1]

    def __enter__(self) -> CheckpointWriter:
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if exc_type is None:
            return
        for stream in self._streams.values():
            stream.__exit__(exc_type, exc, traceback)
        with contextlib.suppress(OSError):  # a failed sync would hide the error that got here
            self._write_back.close()

    def write_part(self, tensors: dict[str, np.ndarray]) -> None:
        """One part's whole tensors (any padded vocabulary size: re-padded for the target)."""
        shards: list[dict[str, np.ndarray]] = [{} for _ in range(self.tp)]
        for name, tensor in tensors.items():
            pieces = split_whole(
                name,
                tensor,
                self.tp,
                config=self.config,
                padded_vocab_size=self.config.padded_vocab_size,
            )
            for tp, piece in enumerate(pieces):
                shards[tp][name] = piece
        if not self.layer_files:
            for tp, shard in enumerate(shards):
                for name, piece in shard.items():
                    stages = self._stages_of(name)
                    saved = self._streams[(tp, stages[0])].add(piece)
                    self._modules[(tp, stages[0])][name] = saved
                    for stage in stages[1:]:  # Megatron's head copy of the word embeddings
                        copy = self._streams[(tp, stage)].add(piece)
                        self._modules[(tp, stage)][HEAD_COPY] = copy
            self.written(stream.path for stream in self._streams.values())
            return
        paths = []
        numbering = _NUMBERING[self.layout]
        for tp, shard in enumerate(shards):
            by_file: dict[int, dict[str, np.ndarray]] = {}
            for name, piece in shard.items():
                index, key = pipeline_file_key(name, self.config.num_layers, numbering)
                by_file.setdefault(index, {})[key] = piece
            for index, state in by_file.items():
                paths.append(self.folder / f"layer_{index:02d}-model_{tp:02d}-model_states.pt")
                ptfile.save(state, paths[-1])
        self.written(paths)

    def written(self, paths) -> None:
        self._write_back.written(paths)

    def _deepspeed_keys(
        self, progress: dict[str, int], *, module: Any, client: dict[str, Any]
    ) -> dict[str, Any]:
        model_parallel = self.tp * self.pp if self.pp > 1 else self.tp
        keys = {
            "module": module,
            "buffer_names": [],
            "optimizer": None,
            "param_shapes": None,
            "frozen_param_shapes": None,
            "shared_params": None,
            "frozen_param_fragments": None,
            "lr_scheduler": None,
            "data_sampler": None,
            "random_ltd": None,
            "skipped_steps": int(progress.get("skipped_iterations", 0)),
            "global_steps": int(progress.get("iteration", 0)),
            "global_samples": int(progress.get("consumed_train_samples", 0)),
            "dp_world_size": 1,
            "mp_world_size": model_parallel,
            "checkpoint_parallel_dimensions": {"pp_degree": self.pp, "tp_degree": self.tp},
            "ds_config": {},
            "ds_version": distribution_version("deepspeed"),
            **client,
        }
        if self.layout == "mds":
            keys[CLIENT_KEY] = {"state": dict(progress), "version": CLIENT_VERSION}
        return keys

    def _module(self, tp: int, stage: int) -> dict[str, Any]:
        """A streamed file's model: Megatron's nesting of the plain GPT names."""
        flat = self._modules[(tp, stage)]
        head = flat.pop(HEAD_COPY, None)
        offset = stage * (self.config.num_layers // self.pp) if self.layout == "megatron" else 0
        nested = megatron_nested(flat, layer_offset=offset)
        if head is not None:
            nested[HEAD_COPY] = {"weight": head}
        return nested

    def finish(
        self,
        progress: dict[str, Any],
        *,
        tokenizer: TokenizerRecord | None = None,
        lr_schedule: dict[str, Any] | None = None,
    ) -> None:
        """Every rank file's pickle: the model (streamed layouts) and the client state;
        `tokenizer` and `lr_schedule` are meta.json's records (for `args`' tokenizer fields and
        the scheduler's state)."""
        self._write_back.close()
        client = upstream_keys(
            self.config,
            tensor_model_parallel_size=self.tp,
            pipeline_model_parallel_size=self.pp,
            progress=progress,
            tokenizer=tokenizer or TokenizerRecord(),
            layout=self.layout,
            lr_schedule=lr_schedule,
        )
        if self.layout == "megatron":
            for (tp, stage), stream in self._streams.items():
                model = self._module(tp, stage)
                stream.close({**client, "model": model})
            return
        if not self.layer_files:
            for (tp, stage), stream in self._streams.items():
                module = self._module(tp, stage)
                stream.close(self._deepspeed_keys(progress, module=module, client=client))
            return
        for stage in range(self.pp):
            for tp in range(self.tp):
                path = self.folder / f"mp_rank_{stage * self.tp + tp:02d}_model_states.pt"
                keys = self._deepspeed_keys(progress, module=None, client=client)
                ptfile.save(keys, path)


@contextlib.contextmanager
def new_save_folder(
    save: Path,
    tag: str,
    *,
    config: GPTConfig,
    tensor_model_parallel_size: int,
    pipeline_model_parallel_size: int,
    layout: str = "mds",
) -> Iterator[tuple[Path, CheckpointWriter]]:
    """(staging folder, a writer of its `tag` folder): `save` appears complete or not at all
    (`atomic_directory`), an error ends the writer's open files before the folder goes, and a
    full disk is one line naming `save` (measured before the staging folder is removed)."""
    with (
        atomic_directory(save) as staging,
        reporting_write_failures(
            save, doing="writing", advice="give --save another folder", reads_too=True
        ),
        CheckpointWriter(
            staging / tag,
            config=config,
            tensor_model_parallel_size=tensor_model_parallel_size,
            pipeline_model_parallel_size=pipeline_model_parallel_size,
            layout=layout,
        ) as writer,
    ):
        yield staging, writer
