"""The source's Adam state (fp32 master weights, `exp_avg`, `exp_avg_sq`, step) per parameter,
whole, from whichever optimizer mds-train's engine ran:

- DeepSpeed's ZeRO-1/2 and BF16 optimizers: `[bf16_]zero_pp_rank_D_mp_rank_MM_optim_states.pt`, one
  flat fp32 partition per parameter group and DP rank; `param_slice_mappings` says where each
  parameter's fragment lies, and DP ranks' fragments concatenated are the parameter;
- ZeRO-3: every parameter split in DP-equal pieces (`ceil(numel / DP)`, zero-padded) laid end to
  end in each rank's flat groups, shapes in `param_shapes` (DeepSpeed's `zero_to_fp32` rule);
- ZeRO-0: torch's AdamW state dict in the `mp_rank_MM` file (the model weights are the fp32
  masters), or mds-train's `MasterWeightAdamW` (`inner` AdamW state + `masters`).

fp16 runs (always ZeRO >= 1 in mds-train) keep fp32 masters in the same ZeRO files, plus the
dynamic loss scaler every partition file pickles: `loss_scaler` is its record (`loss_scale.py`).

Files are memory-mapped, so one parameter's slices are read without loading a whole stage.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from . import ptfile, universal
from .arrays import to_float32
from .engine_names import optimizer_order
from .layout import ZERO_OPTIMIZER_FILE, zero_optimizer_file
from .loss_scale import agreed_record, loss_scaler_record
from .partition import merge_shards
from .ptfile import Missing
from .source import Source
from .zero3 import Zero3Partitions, saved_dp_size

STATE_KEYS = ("exp_avg", "exp_avg_sq")


class OptimizerState:
    """`read(name)` -> {"fp32", "exp_avg", "exp_avg_sq"} whole fp32 tensors; `step` the count."""

    def __init__(self, source: Source, weights: Callable[[str], np.ndarray]) -> None:
        self.source = source
        self._weights = weights  # whole weight by name (ZeRO-0: the masters are the weights)
        # per plain name: one getter per TP rank, each returning {key: tensor at that rank}
        self._getters: dict[str, list[Callable[[], dict[str, np.ndarray]]]] = {}
        self.step: int | None = None
        self.hyperparameters: list[dict[str, Any]] = []
        self.loss_scaler: dict[str, Any] | None = None  # an fp16 run's dynamic scaler
        folder = source.folder
        if source.layout == "megatron":
            raise ValueError(
                f"{folder}: plain Megatron's optimizer state (`optimizer` in model_optim_rng.pt) "
                "is not read yet; reshape without --with-optimizer (mds-train: add "
                "--no-load-optim, or --finetune)"
            )
        self._universal = None
        zero_files = [p for p in folder.iterdir() if ZERO_OPTIMIZER_FILE.fullmatch(p.name)]
        if (folder / universal.FOLDER / universal.GLOBAL_STATE).is_file():  # reshaped before
            self._universal = universal.UniversalState(folder)
            self.step = self._universal.step
            self.hyperparameters = self._universal.param_groups
            self.loss_scaler = (source.meta.optimizer or {}).get("loss_scaler")
        elif zero_files:
            self._index_zero(zero_files)
        else:
            self._index_torch()
        if self.step is None:
            raise ValueError(f"{folder}: the optimizer state holds no step count")

    # -- reading ---------------------------------------------------------------------------

    def read(self, name: str) -> dict[str, np.ndarray]:
        if self._universal is not None:
            return self._universal.read(name)
        getters = self._getters.get(name)
        if getters is None:
            raise ValueError(f"{self.source.folder}: no optimizer state for {name}")
        per_rank = [getter() for getter in getters]
        where = f"{self.source.folder} (optimizer state)"
        out = {}
        for key in ("fp32", *STATE_KEYS):
            if key not in per_rank[0]:  # ZeRO-0 torch AdamW: the weight is the master
                out[key] = to_float32(self._weights(name))
                continue
            out[key] = to_float32(
                merge_shards(
                    name, [r[key] for r in per_rank], config=self.source.config, where=where
                )
            )
        return out

    def names(self) -> list[str]:
        return list(self._getters)

    # -- indexing, per optimizer kind --------------------------------------------------------

    def _set_step(self, value: Any, where: str) -> None:
        step = int(value.item() if isinstance(value, np.ndarray) else value)
        if self.step is not None and step != self.step:
            raise ValueError(f"{where}: step {step} differs from another group's {self.step}")
        self.step = step

    def _add(self, name: str, tp: int, getter: Callable[[], dict[str, np.ndarray]]) -> None:
        getters = self._getters.setdefault(name, [None] * self.source.tensor_model_parallel_size)
        if getters[tp] is None:  # a later stage's copy of the tied embedding is not the owner's
            getters[tp] = getter

    def _index_zero(self, files: list[Path]) -> None:
        by_rank = self._zero_files(files)
        scalers = {}
        for mp in sorted(by_rank):
            dp_files = by_rank[mp]
            # One model-parallel rank's partitions mapped at a time, each read once here.
            states = [ptfile.load(dp_files[d])["optimizer_state_dict"] for d in sorted(dp_files)]
            for dp, state in enumerate(states):
                scalers[dp_files[dp]] = loss_scaler_record(state, dp_files[dp])
            if "fp32_flat_groups" in states[0]:
                self._index_zero3(mp)
            else:
                self._index_fragments(mp, dp_files, states)
        self.loss_scaler = agreed_record(scalers)

    def _zero_files(self, files: list[Path]) -> dict[int, dict[int, Path]]:
        """{mp rank: {dp rank: file}}, every partition of the DP x MP ranks the state was saved
        at: the DP size is the one the present files record (DeepSpeed's `partition_count`), so
        a missing last rank is named too, not read as a smaller DP size."""
        source = self.source
        folder = source.folder
        num_mp = source.tensor_model_parallel_size * source.pipeline_model_parallel_size
        files = sorted(files)
        num_dp = saved_dp_size(ptfile.load(files[0])["optimizer_state_dict"])
        if num_dp is None:  # older files: the recorded DP size, else the largest rank's
            ranks = [int(ZERO_OPTIMIZER_FILE.fullmatch(path.name).group(1)) for path in files]
            num_dp = source.meta.parallel.data_parallel_size or max(ranks) + 1
        bf16 = files[0].name.startswith("bf16_")
        wanted = {
            (mp, dp): zero_optimizer_file(dp, mp, bf16=bf16)
            for mp in range(num_mp)
            for dp in range(num_dp)
        }
        sizes = f"{num_dp} data-parallel x {num_mp} model-parallel partitions"
        absent = [name for name in wanted.values() if not (folder / name).is_file()]
        if absent:
            shown = ", ".join(absent[:3]) + (f" and {len(absent) - 3} more" if absent[3:] else "")
            raise ValueError(
                f"{folder}: missing rank files: {shown}, of the optimizer state's {sizes}; copy "
                "the whole checkpoint folder again, or reshape without --with-optimizer"
            )
        extra = sorted({path.name for path in files} - set(wanted.values()))
        if extra:
            raise ValueError(
                f"{folder / extra[0]}: not one of the optimizer state's {sizes} (another "
                "run's file?); remove it"
            )
        by_rank: dict[int, dict[int, Path]] = {}
        for (mp, dp), name in wanted.items():
            by_rank.setdefault(mp, {})[dp] = folder / name
        return by_rank

    def _index_fragments(self, mp: int, files: dict[int, Path], states: list[dict]) -> None:
        """ZeRO-1/2 and the BF16 optimizer: named fragments per DP rank (`states`: each rank's
        `optimizer_state_dict`). The partitions are memory-mapped anew for each parameter read
        and let go after it."""

        def load_states() -> list[dict]:
            return [ptfile.load(files[d])["optimizer_state_dict"] for d in range(len(files))]

        tp = mp % self.source.tensor_model_parallel_size
        shapes = self._param_shapes(mp)
        num_groups = len(states[0]["single_partition_of_fp32_groups"])
        self.hyperparameters = self.hyperparameters or _hyperparameters(
            states[0]["base_optimizer_state"]
        )
        for group in range(num_groups):
            for dp, state in enumerate(states):
                group_state = state["base_optimizer_state"]["state"].get(group, {})
                if "step" in group_state:
                    self._set_step(group_state["step"], str(files[dp]))
            pieces: dict[str, list[tuple[int, Any]]] = {}
            for dp, state in enumerate(states):
                for engine_name, address in state["param_slice_mappings"][group].items():
                    pieces.setdefault(engine_name, []).append((dp, address))
            for engine_name, fragments in pieces.items():
                shape = shapes[engine_name]
                name = self.source.plain_name(engine_name)

                def getter(fragments=fragments, group=group, shape=shape, name=name):
                    states = load_states()
                    out = {}
                    for key in ("fp32", *STATE_KEYS):
                        parts = []
                        for dp, address in fragments:
                            state = states[dp]
                            flat = (
                                state["single_partition_of_fp32_groups"][group]
                                if key == "fp32"
                                else state["base_optimizer_state"]["state"][group][key]
                            )
                            parts.append(_narrow(flat, address))
                        out[key] = self.source.own_rows(name, np.concatenate(parts).reshape(shape))
                    return out

                self._add(name, tp, getter)
        del states

    def _index_zero3(self, tp: int) -> None:
        """ZeRO-3: each parameter's DP pieces of equal length, end to end in flat groups."""
        partitions = Zero3Partitions(self.source.folder, tp)
        self.hyperparameters = self.hyperparameters or _hyperparameters(partitions.base)
        for step in partitions.steps():
            self._set_step(step, str(self.source.folder))
        for name in partitions.shapes:

            def getter(name=name):
                return partitions.read([name], ("fp32", *STATE_KEYS))[name]

            self._add(name, tp, getter)

    def _param_shapes(self, mp: int, *, zero3: bool = False) -> dict[str, tuple[int, ...]]:
        name = (
            f"zero_pp_rank_0_mp_rank_{mp:02d}_model_states.pt"
            if zero3
            else f"mp_rank_{mp:02d}_model_states.pt"
        )
        shapes = ptfile.load(self.source.folder / name).get("param_shapes")
        if not shapes:
            raise ValueError(
                f"{self.source.folder / name}: no param_shapes for the ZeRO partitions"
            )
        return {k: tuple(v) for group in shapes for k, v in group.items()}

    def _index_torch(self) -> None:
        """ZeRO-0: the torch optimizer's state dict inside each mp_rank file."""
        source = self.source
        for mp in range(source.tensor_model_parallel_size * source.pipeline_model_parallel_size):
            path = source.folder / f"mp_rank_{mp:02d}_model_states.pt"
            optimizer = ptfile.load(path).get("optimizer")
            if not isinstance(optimizer, dict):
                raise ValueError(
                    f"{path}: holds no optimizer state (saved without it, or by an engine "
                    "mds-merge-mp does not read); reshape without --with-optimizer"
                )
            if "inner" in optimizer and "masters" in optimizer:  # mds-train's MasterWeightAdamW
                optimizer = optimizer["inner"]
            if "state" not in optimizer or "param_groups" not in optimizer:
                raise ValueError(f"{path}: the optimizer state is not torch's (fp16 is not read)")
            self.hyperparameters = self.hyperparameters or _hyperparameters(optimizer)
            stage, tp = divmod(mp, source.tensor_model_parallel_size)
            order = optimizer_order(
                source.config, stage=stage, num_stages=source.pipeline_model_parallel_size
            )
            ids = [i for group in optimizer["param_groups"] for i in group["params"]]
            if len(ids) != len(order):
                raise ValueError(
                    f"{path}: the optimizer holds {len(ids)} parameters, this model's stage "
                    f"{stage} has {len(order)}"
                )
            for position, (name, index) in enumerate(zip(order, ids, strict=True)):
                state = optimizer["state"].get(index)
                if not state or any(key not in state for key in STATE_KEYS):
                    raise ValueError(f"{path}: no Adam moments for {name} (an SGD run?)")
                self._set_step(state["step"], str(path))
                self._add(name, tp, lambda p=path, i=index, m=position: _torch_entry(p, i, m))


def _torch_entry(path: Path, index: int, position: int) -> dict[str, np.ndarray]:
    """One parameter's state from an mp_rank file, memory-mapped anew (let go after use)."""
    optimizer = ptfile.load(path)["optimizer"]
    masters = None
    if "inner" in optimizer and "masters" in optimizer:
        masters = [m for group in optimizer["masters"] for m in group]
        optimizer = optimizer["inner"]
    entry = {key: optimizer["state"][index][key] for key in STATE_KEYS}
    if masters is not None:
        entry["fp32"] = masters[position]
    return entry


def _hyperparameters(optimizer_state: dict) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in group.items() if k != "params"}
        for group in optimizer_state.get("param_groups", [])
    ]


def _narrow(flat: np.ndarray, address: Any) -> np.ndarray:
    """DeepSpeed's `fragment_address(numel, start)` (ptfile reads it as a `Missing` record)."""
    fields = address.state if isinstance(address, Missing) else vars(address)
    return flat[fields["start"] : fields["start"] + fields["numel"]]
