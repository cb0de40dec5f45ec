"""Optimizer state without a topology: DeepSpeed's universal checkpoint (the `zero/` folder of a
checkpoint, as deepspeed/checkpoint/ds_to_universal.py writes it and DeepSpeed's
`load_hp_checkpoint_state` reads it).

`zero/<engine name>/{fp32,exp_avg,exp_avg_sq,step}.pt`: one folder per parameter, named as the
DeepSpeed engine that loads it names the parameter (`param_names`, so `named_parameters()`: the
plain engine's Megatron nesting, the pipeline engine's `tied_modules.embed.X` / `{spec}.X`).
Each state file is `{"param": whole fp32 tensor, "cat_dim": d}` (`cat_dim` only for split
parameters; the word embeddings also carry `"vocab_tensor": True`), `step.pt` the step as torch's
Adam keeps it (a 0-dim float tensor). `zero/optimizer_state.pt` holds the parameter groups'
hyper-parameters, `ds_version` (DeepSpeed's ZeRO loader asserts it) and the step.
A loader at any TP, PP and DP takes its own slices (`shard`, as torch tensors); the readers take
folders named by either engine (pipeline: either fork's numbering) or by the plain GPT's names
(mds-merge-mp's output before), and word embeddings of any row count (ds_to_universal strips
the padding rows; mds keeps them): cut or zero-padded to the loader's rows.
Written and read with `ptfile` (numpy); `torch.load` reads the files too.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from mds_common.sidecar import distribution_version
from mds_model import GPTConfig
from mds_model.naming import (
    EMBEDDING_INDEX,
    LM_HEAD,
    TIED_PREFIX,
    Split,
    pipe_numbering,
    split_of,
)
from mds_model.parameters import GATED

from . import ptfile
from .arrays import as_tensor, to_float32
from .engine_names import megatron_to_plain, pipeline_to_plain
from .layout import CLIENT_KEY
from .meta import CheckpointMeta
from .partition import resize_vocab, shard_for_rank

if TYPE_CHECKING:
    import torch

FOLDER = "zero"
GLOBAL_STATE = "optimizer_state.pt"
STEP = "step"
KEYS = ("fp32", "exp_avg", "exp_avg_sq")
# deepspeed/checkpoint/constants.py
CAT_DIM, VOCAB_TENSOR, SUB_PARAMS = "cat_dim", "vocab_tensor", "param_n_sub_params"
# Every split kind but a gated MLP's is the same in every architecture; that one the state file
# declares (`param_n_sub_params`), as DeepSpeed's loader reads it. Replicated parameters are told
# by name, not by a missing cat_dim: ds_to_universal gives every parameter of a TP=1 source one.
_ANY_ARCHITECTURE = GPTConfig(num_layers=1, hidden_size=1, num_attention_heads=1, vocab_size=1)


def split_of_record(name: str, record: dict[str, Any]) -> Split:
    """The split of a universal state file's parameter (plain name `name`)."""
    sub_params = int(record.get(SUB_PARAMS, 1))
    if sub_params == 2 and int(record.get(CAT_DIM, 0)) == 0:
        return Split(GATED)
    if sub_params != 1:
        raise ValueError(f"{sub_params} sub-parameters of {name}; mds reads 2 on dimension 0")
    return split_of(name, _ANY_ARCHITECTURE)


def write_parameter(
    folder: Path,
    name: str,
    states: dict[str, np.ndarray],
    *,
    config: GPTConfig,
    rows: int,
    step: int,
    engine_name: str,
) -> list[Path]:
    """The whole fp32 master, moments and step of one parameter (plain name `name` in
    `config`'s architecture, vocabulary rows cut/padded to `rows`) in `zero/<engine_name>/`;
    returns the files written."""
    split = split_of(name, config)
    target = folder / FOLDER / engine_name
    target.mkdir(parents=True, exist_ok=True)
    paths = []
    for key in KEYS:
        tensor = to_float32(states[key])
        if split.vocab:
            tensor = resize_vocab(tensor, rows)
        record: dict[str, Any] = {"param": tensor}
        if split.dim is not None:
            record[CAT_DIM] = split.dim
        if split.kind == GATED:
            record[SUB_PARAMS] = 2
        if split.vocab:
            record[VOCAB_TENSOR] = True
        paths.append(target / f"{key}.pt")
        ptfile.save(record, paths[-1])
    # torch's Adam keeps the step as a 0-dim float tensor; DeepSpeed's loader puts this file's
    # content into the optimizer's state as it is.
    paths.append(target / f"{STEP}.pt")
    ptfile.save(np.array(float(step), dtype=np.float32), paths[-1])
    return paths


def write_global_state(folder: Path, *, step: int, param_groups: list[dict[str, Any]]) -> None:
    """`zero/optimizer_state.pt`: the groups' hyper-parameters (DeepSpeed's loader copies every
    key but `params` into its groups), `ds_version` (its ZeRO-1/2 `_load_global_state` asserts
    one) and the step (mds's readers; DeepSpeed's reads each parameter's step.pt)."""
    (folder / FOLDER).mkdir(parents=True, exist_ok=True)
    state = {
        "param_groups": param_groups,
        "ds_version": distribution_version("deepspeed"),
        STEP: step,
    }
    ptfile.save(state, folder / FOLDER / GLOBAL_STATE)


def plain_names(folders: list[str]) -> dict[str, str]:
    """{plain GPT name: folder name} of a `zero/` folder's parameter folders, named by either
    engine (the pipeline's in either fork's numbering, told apart by the indices present; an
    untied embedding `1.X`, an untied head `{final + 1}.lm_head.X`) or by the plain GPT's
    names."""
    heads = {n.split(".", 1)[0] for n in folders if n.split(".", 1)[-1].startswith(LM_HEAD)}
    indices = sorted(
        {
            int(n.split(".", 1)[0])
            for n in folders
            if n.split(".", 1)[0].isdigit() and n.split(".", 1)[0] not in heads
        }
        - {EMBEDDING_INDEX}
    )
    numbering, num_layers = None, len(indices) - 1
    if indices:
        numbering = pipe_numbering([EMBEDDING_INDEX, *indices])
        if numbering is None:
            raise ValueError(
                f"pipeline parameter folders numbered {indices}: neither fork's GPTModelPipe "
                "numbers its layers so"
            )
    out = {}
    for folder in folders:
        if folder.startswith(TIED_PREFIX) or folder.split(".", 1)[0].isdigit():
            plain = pipeline_to_plain(folder, num_layers, numbering or "deepspeedai")
        elif folder.startswith("language_model."):
            plain = megatron_to_plain(folder)
        else:
            plain = folder
        out[plain] = folder
    return out


def check_parameter_files(folder: Path, name: str) -> None:
    """`zero/<name>/` holds every state file a loader reads, each a whole torch file: ValueError
    in one line naming the file otherwise (DeepSpeed's own loader says only `exp_avg not found
    in optimizer state fragment`, or gives a long traceback for a file cut short)."""
    for key in (*KEYS, STEP):
        path = folder / f"{key}.pt"
        if key == STEP and not path.exists():
            continue  # optional: the step is in optimizer_state.pt too
        if not path.is_file():
            raise ValueError(
                f"{path}: missing, the {key} of {name}; the universal checkpoint is incomplete: "
                "copy it again, or write it again with mds-merge-mp --with-optimizer"
            )
        try:
            ptfile.check(path)
        except ValueError as error:
            raise ValueError(
                f"{error}; the universal checkpoint is damaged or incomplete: copy it again"
            ) from None


class UniversalState:
    """Reads a checkpoint's `zero/` folder: `step`, `read(name)`, `shard(name, ...)` by plain
    GPT names."""

    def __init__(self, checkpoint_folder: Path) -> None:
        self.folder = Path(checkpoint_folder) / FOLDER
        path = self.folder / GLOBAL_STATE
        if not path.is_file():
            raise ValueError(f"{path}: missing; the checkpoint holds no universal optimizer state")
        state = ptfile.load(path)
        self.param_groups = [
            {k: v for k, v in group.items() if k != "params"}
            for group in state.get("param_groups", [])
        ]
        try:
            self._folders = plain_names(sorted(p.name for p in self.folder.iterdir() if p.is_dir()))
        except ValueError as error:
            raise ValueError(f"{self.folder}: {error}") from None
        self.step = self._step(state)

    def _step(self, state: dict[str, Any]) -> int:
        """mds-merge-mp records the step in optimizer_state.pt; ds_to_universal only in each
        parameter's step.pt (ZeRO's base optimizer state)."""
        if state.get(STEP) is not None:
            return int(state[STEP])
        for folder in self._folders.values():
            path = self.folder / folder / f"{STEP}.pt"
            if path.is_file():
                value = ptfile.load(path)
                return int(value.item() if isinstance(value, np.ndarray) else value)
        raise ValueError(f"{self.folder}: no step in {GLOBAL_STATE} nor in any {STEP}.pt")

    def names(self) -> list[str]:
        return list(self._folders)

    def read(self, name: str) -> dict[str, np.ndarray]:
        """The whole fp32 master, exp_avg and exp_avg_sq of one parameter (memory-mapped)."""
        return {key: record["param"] for key, record in self._records(name).items()}

    def _records(self, name: str) -> dict[str, dict[str, Any]]:
        folder = self._folders.get(name)
        if folder is None:
            raise ValueError(f"{self.folder}: no optimizer state of {name}")
        out = {}
        for key in KEYS:
            path = self.folder / folder / f"{key}.pt"
            if not path.is_file():
                raise ValueError(f"{path}: missing optimizer state of {name}")
            out[key] = ptfile.load(path)
        return out

    def shard(
        self, name: str, *, tp_rank: int, tensor_model_parallel_size: int, padded_vocab_size: int
    ) -> dict[str, torch.Tensor]:
        """One tensor-parallel rank's slices of `read(name)` (vocabulary cut or zero-padded to
        `padded_vocab_size` rows, as DeepSpeed's loader pads its unpadded files), as torch
        tensors for the trainer."""
        records = self._records(name)
        try:
            split = split_of_record(name, records["fp32"])
        except ValueError as error:
            raise ValueError(f"{self.folder / self._folders[name]}: {error}") from None
        return {
            key: as_tensor(
                shard_for_rank(
                    name,
                    record["param"],
                    split=split,
                    tp_rank=tp_rank,
                    tensor_model_parallel_size=tensor_model_parallel_size,
                    padded_vocab_size=padded_vocab_size,
                )
            )
            for key, record in records.items()
        }


def universal_meta(folder: Path) -> CheckpointMeta:
    """meta.json's shape for a universal checkpoint folder without one (DeepSpeed's
    ds_to_universal output: the source's mp_rank files and `zero/`): the model and progress from
    the first mp_rank file's `args` and upstream keys, mds-train's progress record where the
    source was mds-train's."""
    from .describe import config_from_megatron_args
    from .layout import MP_RANK_FILE
    from .meta import Progress
    from .source import megatron_meta, vocabulary_info

    files = sorted(p for p in folder.iterdir() if MP_RANK_FILE.fullmatch(p.name))
    if not files:
        raise ValueError(f"{folder}: no mp_rank_*_model_states.pt beside {FOLDER}/")
    state = ptfile.load(files[0])
    args = state.get("args")
    if args is None:
        raise ValueError(
            f"{files[0]}: no Megatron args and no meta.json beside; cannot tell the model's shape"
        )
    tp = int(getattr(args, "tensor_model_parallel_size", 1) or 1)
    pp = int(getattr(args, "pipeline_model_parallel_size", 1) or 1)
    config = config_from_megatron_args(
        args,
        checkpoint_info=vocabulary_info(state),
        tensor_model_parallel_size=tp,
        where=str(files[0]),
    )
    meta = megatron_meta(state, config, tp, pp)
    client = state.get(CLIENT_KEY)
    if isinstance(client, dict) and isinstance(client.get("state"), dict):
        recorded = {k: v for k, v in client["state"].items() if v is not None}
        meta = meta.replace(progress=Progress.from_dict({**meta.progress.to_dict(), **recorded}))
    return meta.replace(optimizer={"layout": "universal", "folder": FOLDER})
