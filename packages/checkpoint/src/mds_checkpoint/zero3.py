"""ZeRO-3 checkpoints of DeepSpeed's plain engine: the weights exist only as fp32 partitions.

`zero_pp_rank_D_mp_rank_TT_model_states.pt` holds empty placeholders and `param_shapes`;
`zero_pp_rank_D_mp_rank_TT_optim_states.pt` holds each DP rank's flat groups (`fp32_flat_groups`
and the Adam moments alike). Every parameter, in `param_shapes` order, takes `ceil(numel / DP)`
values of each rank's groups laid end to end, zero-padded at its end (DeepSpeed's `zero_to_fp32`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from mds_model import GPTConfig

from . import ptfile
from .arrays import convert
from .engine_names import plain_engine_to_plain
from .layout import zero_optimizer_file
from .sources import Shards, _split_by_part


def _numel(shape: tuple[int, ...]) -> int:
    total = 1
    for size in shape:
        total *= size
    return total


def _flat_slice(groups: list[np.ndarray], start: int, length: int) -> np.ndarray:
    """`length` values from `start` of the groups laid end to end."""
    parts, position = [], 0
    for tensor in groups:
        size = tensor.size
        lo, hi = max(start, position), min(start + length, position + size)
        if lo < hi:
            parts.append(tensor[lo - position : hi - position])
        position += size
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def saved_dp_size(optimizer_state: dict) -> int | None:
    """The data-parallel size a ZeRO partition file was written at: DeepSpeed's
    `partition_count` (one per group at ZeRO-1/2 and in the BF16 optimizer, one number at
    ZeRO-3); None when the file records none."""
    count = optimizer_state.get("partition_count")
    if isinstance(count, list | tuple):
        count = max(count, default=None)
    try:
        return None if count is None else int(count)
    except (TypeError, ValueError):
        return None


class Zero3Partitions:
    """One TP rank's ZeRO-3 files: `read(name, key)` for key fp32, exp_avg or exp_avg_sq."""

    def __init__(self, folder: Path, tp: int) -> None:
        self.folder = folder
        # `bf16_` where the engine ran bf16 (layout.zero_optimizer_file)
        for bf16 in (True, False):
            files = sorted(folder.glob(zero_optimizer_file("*", tp, bf16=bf16)))
            if files:
                break
        if not files:
            raise ValueError(f"{folder}: missing rank files: no ZeRO-3 partitions of TP rank {tp}")
        # The DP size the files were written at (the count found falls short when one is lost).
        world = saved_dp_size(ptfile.load(files[0])["optimizer_state_dict"]) or len(files)
        wanted = [zero_optimizer_file(d, tp, bf16=bf16) for d in range(world)]
        absent = [name for name in wanted if not (folder / name).is_file()]
        if absent:
            raise ValueError(f"{folder}: missing rank files: {', '.join(absent)}")
        self.paths = [folder / name for name in wanted]
        first = self._states()[0]
        model_file = folder / f"zero_pp_rank_0_mp_rank_{tp:02d}_model_states.pt"
        shapes = ptfile.load(model_file).get("param_shapes")
        if not shapes:
            raise ValueError(f"{model_file}: no param_shapes for the ZeRO-3 partitions")
        # By plain GPT name (param_shapes names them as the engine's module did).
        self.shapes = {
            plain_engine_to_plain(k): tuple(v) for group in shapes for k, v in group.items()
        }
        self._offsets: dict[str, tuple[int, int]] = {}
        offset = 0
        for name, shape in self.shapes.items():
            piece = -(-_numel(shape) // world)
            self._offsets[name] = (offset, piece)
            offset += piece
        available = sum(t.size for t in first["fp32_flat_groups"])
        if offset != available:
            raise ValueError(
                f"{folder}: ZeRO-3 partitions of TP rank {tp} hold {available} values per rank, "
                f"the parameter shapes need {offset}"
            )
        self.base = first["optimizer_state_dict"]

    def _states(self) -> list[dict[str, Any]]:
        """Every DP rank's partitions, memory-mapped anew: let go after each use, so the pages
        read stay mapped only while their parameters are being written."""
        return [ptfile.load(path)["optimizer_state_dict"] for path in self.paths]

    def read(self, names: list[str], keys: tuple[str, ...] = ("fp32",)) -> dict[str, dict]:
        """{name: {key: whole tensor}} for key fp32, exp_avg or exp_avg_sq."""
        states = self._states()
        out: dict[str, dict] = {}
        for name in names:
            offset, piece = self._offsets[name]
            shape = self.shapes[name]
            out[name] = {}
            for key in keys:
                parts = []
                for state in states:
                    if key == "fp32":
                        groups = state["fp32_flat_groups"]
                    else:
                        inner = state["optimizer_state_dict"]["state"]
                        groups = [inner[g][key] for g in range(len(state["fp32_flat_groups"]))]
                    parts.append(_flat_slice(groups, offset, piece))
                out[name][key] = np.concatenate(parts)[: _numel(shape)].reshape(shape)
        return out

    def steps(self) -> list[Any]:
        return [s["step"] for s in self.base["state"].values() if "step" in s]


class Zero3Files:
    """The weights of a ZeRO-3 checkpoint, from the fp32 partitions, in the run's dtype."""

    def __init__(self, folder: Path, *, tensor_model_parallel_size: int, config: GPTConfig) -> None:
        self.folder, self.tensor_model_parallel_size, self.config = (
            folder,
            tensor_model_parallel_size,
            config,
        )
        self.partitions = [Zero3Partitions(folder, tp) for tp in range(tensor_model_parallel_size)]
        self._parts = []
        for partitions in self.partitions:
            lazy = {name: name for name in partitions.shapes}
            try:
                self._parts.append(
                    _split_by_part(
                        lazy, config.num_layers, head=config.untie_embeddings_and_output_weights
                    )
                )
            except ValueError as error:
                raise ValueError(f"{folder}: {error}") from None

    def read_part(self, part: str) -> Shards:
        dtype = self.config.params_dtype
        shards = []
        for partitions, parts in zip(self.partitions, self._parts, strict=True):
            read = partitions.read(list(parts[part]))
            shards.append({name: convert(read[name]["fp32"], dtype) for name in parts[part]})
        return shards

    def where(self, part: str) -> str:
        return f"{self.folder}/zero_pp_rank_0_mp_rank_00_optim_states.pt"
