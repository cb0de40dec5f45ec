"""Optimizer state without a topology: one folder per parameter, whole tensors, DeepSpeed's
universal-checkpoint file format (`zero/<name>/{fp32,exp_avg,exp_avg_sq}.pt`).

Each file is `{"param": tensor, "cat_dim": d}` (`cat_dim` only for split parameters; the word
embeddings also carry `"vocab_tensor": True`), fp32, named by the plain GPT's parameter names and
padded to the checkpoint's vocabulary. `zero/optimizer_state.pt` holds the step and the
hyper-parameters of the parameter groups. A loader at any TP, PP and DP takes its own slices
(`shard`, as torch tensors), which is how `mds-train --load` resumes at another topology.
Written and read with `ptfile` (numpy); `torch.load` reads the files too.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from . import ptfile
from .arrays import as_tensor, to_float32
from .names import split_of
from .partition import resize_vocab, shard_for_rank

if TYPE_CHECKING:
    import torch

FOLDER = "zero"
GLOBAL_STATE = "optimizer_state.pt"
KEYS = ("fp32", "exp_avg", "exp_avg_sq")


def write_parameter(
    folder: Path, name: str, states: dict[str, np.ndarray], *, rows: int
) -> list[Path]:
    """The whole fp32 master and moments of one parameter (word embeddings cut/padded to rows);
    returns the files written."""
    split = split_of(name)
    target = folder / FOLDER / name
    target.mkdir(parents=True, exist_ok=True)
    paths = []
    for key in KEYS:
        tensor = to_float32(states[key])
        if split.vocab:
            tensor = resize_vocab(tensor, rows)
        record: dict[str, Any] = {"param": tensor}
        if split.dim is not None:
            record["cat_dim"] = split.dim
        if split.vocab:
            record["vocab_tensor"] = True
        paths.append(target / f"{key}.pt")
        ptfile.save(record, paths[-1])
    return paths


def write_global_state(folder: Path, *, step: int, param_groups: list[dict[str, Any]]) -> None:
    (folder / FOLDER).mkdir(parents=True, exist_ok=True)
    ptfile.save({"step": step, "param_groups": param_groups}, folder / FOLDER / GLOBAL_STATE)


class UniversalState:
    """Reads a checkpoint's `zero/` folder: `step`, `read(name)`, `shard(name, ...)`."""

    def __init__(self, checkpoint_folder: Path) -> None:
        self.folder = Path(checkpoint_folder) / FOLDER
        path = self.folder / GLOBAL_STATE
        if not path.is_file():
            raise ValueError(f"{path}: missing; the checkpoint holds no reshaped optimizer state")
        state = ptfile.load(path)
        self.step = int(state["step"])
        self.param_groups = state.get("param_groups", [])

    def read(self, name: str) -> dict[str, np.ndarray]:
        """The whole fp32 master, exp_avg and exp_avg_sq of one parameter (memory-mapped)."""
        out = {}
        for key in KEYS:
            path = self.folder / name / f"{key}.pt"
            if not path.is_file():
                raise ValueError(f"{path}: missing optimizer state of {name}")
            out[key] = ptfile.load(path)["param"]
        return out

    def shard(
        self, name: str, *, tp_rank: int, tp_size: int, padded_vocab_size: int
    ) -> dict[str, torch.Tensor]:
        """One tensor-parallel rank's slices of `read(name)` (vocabulary re-padded), as torch
        tensors for the trainer."""
        return {
            key: as_tensor(
                shard_for_rank(
                    name,
                    tensor,
                    tp_rank=tp_rank,
                    tp_size=tp_size,
                    padded_vocab_size=padded_vocab_size,
                )
            )
            for key, tensor in self.read(name).items()
        }
