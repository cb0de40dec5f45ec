"""Writing an mds-train checkpoint at a target (TP, PP), one model part at a time.

PP > 1: DeepSpeed's pipeline files, `layer_XX-model_YY-model_states.pt` per GPTModelPipe index and
TP rank (written as each part arrives), and one `mp_rank_MM_model_states.pt` per (stage, TP rank)
with `module` None (MM = stage * TP + tp). PP = 1: the plain engine's `mp_rank_YY_model_states.pt`
with the GPT's state dict under `module`, streamed tensor by tensor (`ptfile.StreamingSave`). Every
mp_rank file carries the DeepSpeed keys its loader reads and mds-train's progress
(`mds_train.state`). Tensors are numpy arrays (`arrays.py`), written in torch.save's format by
`ptfile`. What is written goes to disk in the background as the next parts are made
(`writeback.py`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from mds_common.files import atomic_directory
from mds_common.sidecar import distribution_version
from mds_model import GPTConfig

from . import ptfile
from .names import layer_of
from .partition import split_whole
from .writeback import WriteBack

CLIENT_KEY = "mds_train"  # mds-train's client state in DeepSpeed's mp_rank files
CLIENT_VERSION = 1


def tag_for(iteration: int) -> str:
    return f"global_step{iteration}"


def pipeline_file_key(name: str, config: GPTConfig) -> tuple[int, str]:
    """(GPTModelPipe index, key inside its layer file) of a plain-GPT parameter name."""
    layer = layer_of(name)
    if layer is not None:
        return layer[0] + 3, layer[1]
    if name.startswith("embedding."):
        return 1, name[len("embedding.") :]
    if name.startswith("final_layernorm."):
        return config.num_layers + 4, name[len("final_layernorm.") :]
    raise ValueError(f"no pipeline layer holds {name}")


class CheckpointWriter:
    """`write_part(tensors)` for every part (embedding, layers, final norm), then `finish`;
    `written(paths)` hands other files written beside them (optimizer state) to the write-back.
    Used as a context manager: an error ends the open files and the write-back at once (the
    caller removes the folder), not in some finalizer later."""

    def __init__(self, folder: Path, *, config: GPTConfig, pipeline_parallel: int) -> None:
        self.folder, self.config, self.pp = folder, config, pipeline_parallel
        self.tp = config.tensor_model_parallel_size
        folder.mkdir(parents=True, exist_ok=True)
        self._streams: list[ptfile.StreamingSave] = []
        self._modules: list[dict[str, Any]] = []
        self._write_back = WriteBack()
        if self.pp == 1:
            for tp in range(self.tp):
                self._streams.append(
                    ptfile.StreamingSave(folder / f"mp_rank_{tp:02d}_model_states.pt")
                )
                self._modules.append({})

    def __enter__(self) -> CheckpointWriter:
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if exc_type is None:
            return
        for stream in self._streams:
            stream.__exit__(exc_type, exc, traceback)
        with contextlib.suppress(OSError):  # a failed sync would hide the error that got here
            self._write_back.close()

    def write_part(self, tensors: dict[str, np.ndarray]) -> None:
        """One part's whole tensors (any padded vocabulary size: re-padded for the target)."""
        shards: list[dict[str, np.ndarray]] = [{} for _ in range(self.tp)]
        for name, tensor in tensors.items():
            pieces = split_whole(
                name, tensor, self.tp, padded_vocab_size=self.config.padded_vocab_size
            )
            for tp, piece in enumerate(pieces):
                shards[tp][name] = piece
        if self.pp == 1:
            for tp, shard in enumerate(shards):
                for name, piece in shard.items():
                    self._modules[tp][name] = self._streams[tp].add(piece)
            self.written(stream.path for stream in self._streams)
            return
        paths = []
        for tp, shard in enumerate(shards):
            by_file: dict[int, dict[str, np.ndarray]] = {}
            for name, piece in shard.items():
                index, key = pipeline_file_key(name, self.config)
                by_file.setdefault(index, {})[key] = piece
            for index, state in by_file.items():
                paths.append(self.folder / f"layer_{index:02d}-model_{tp:02d}-model_states.pt")
                ptfile.save(state, paths[-1])
        self.written(paths)

    def written(self, paths) -> None:
        self._write_back.written(paths)

    def _deepspeed_keys(self, progress: dict[str, int], *, module: Any) -> dict[str, Any]:
        model_parallel = self.tp * self.pp if self.pp > 1 else self.tp
        return {
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
            CLIENT_KEY: {"state": dict(progress), "version": CLIENT_VERSION},
        }

    def finish(self, progress: dict[str, int]) -> None:
        self._write_back.close()
        if self.pp == 1:
            for stream, module in zip(self._streams, self._modules, strict=True):
                stream.close(self._deepspeed_keys(progress, module=module))
            return
        for stage in range(self.pp):
            for tp in range(self.tp):
                path = self.folder / f"mp_rank_{stage * self.tp + tp:02d}_model_states.pt"
                ptfile.save(self._deepspeed_keys(progress, module=None), path)


@contextlib.contextmanager
def new_save_folder(
    save: Path, tag: str, *, config: GPTConfig, pipeline_parallel: int
) -> Iterator[tuple[Path, CheckpointWriter]]:
    """(staging folder, a writer of its `tag` folder): `save` appears complete or not at all
    (`atomic_directory`), and an error ends the writer's open files before the folder goes."""
    with (
        atomic_directory(save) as staging,
        CheckpointWriter(
            staging / tag, config=config, pipeline_parallel=pipeline_parallel
        ) as writer,
    ):
        yield staging, writer
