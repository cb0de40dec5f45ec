"""Readers of the source layouts, one model part at a time: "embedding", "layers.I", "final".

Each reader answers `read_part(part)` with one dict per tensor-parallel rank, keyed by plain-GPT
names (`mds_model.naming`); `partition.py` joins them. The parts are "embedding", "layers.I",
"final" and, for an untied output layer, "head". Layouts (README: "Layouts read"):
- DeepSpeed pipeline files (mds-train with PP > 1, Megatron-DeepSpeed): `layer_XX-model_YY-model_
  states.pt`, XX the GPTModelPipe index, YY the TP rank. bigscience's GPTModelPipe numbers them
  01 embedding, 03.. layers, N+4 final norm (its two transpose lambdas take 02 and N+3);
  deepspeedai/Megatron-DeepSpeed's has no lambdas: 01, 02..N+1, N+2, and an untied head's
  LMHeadPipe N+3 (`lm_head.weight`). The files tell which;
- DeepSpeed plain-engine files: `mp_rank_YY_model_states.pt`['module'], the GPT's flat names
  (mds-train with PP = 1) or Megatron's nested `language_model` dict (Megatron-DeepSpeed's
  `pretrain_gpt.py` without a pipeline); at ZeRO-3 the weights live in the fp32 partitions
  instead (`zero3.py`);
- plain Megatron: `mp_rank_YY[_ZZZ]/model_optim_rng.pt`['model'] (or virtual stages 'model0',
  'model1', ...), chunk-local layer numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from mds_model.naming import (
    FINAL_NORM,
    LM_HEAD,
    OUTPUT_LAYER,
    QKV_BLOCKS,
    QKV_PER_HEAD,
    canonical_layer_key,
    layer_name,
    pipe_numbering,
    qkv_order_of_version,
)

from . import ptfile
from .layout import LAYER_FILE, MEGATRON_FILE, MEGATRON_RANK_DIR, MP_RANK_FILE

EMBEDDING, FINAL, HEAD = "embedding", "final", "head"
Shards = list[dict[str, np.ndarray]]
_OUTPUT_PREFIX = OUTPUT_LAYER.split(".")[0] + "."  # "output_layer."


def layer_part(index: int) -> str:
    return f"layers.{index}"


def part_names(num_layers: int, *, head: bool = False) -> list[str]:
    """The parts of a model, in the order they are read and written; `head`: an untied output
    layer (its own part, after the final norm)."""
    return [
        EMBEDDING,
        *(layer_part(i) for i in range(num_layers)),
        FINAL,
        *([HEAD] if head else []),
    ]


def _missing_ranks(folder: Path, wanted: list[str]) -> None:
    absent = [name for name in wanted if not (folder / name).exists()]
    if absent:
        shown = ", ".join(absent[:3]) + (f" and {len(absent) - 3} more" if len(absent) > 3 else "")
        raise ValueError(f"{folder}: missing rank files: {shown}")


class LayerFiles:
    """DeepSpeed pipeline layer files (the same names from mds-train and Megatron-DeepSpeed)."""

    def __init__(self, folder: Path, *, heads: int, qkv_order: str) -> None:
        self.folder, self.heads, self.qkv_order = folder, heads, qkv_order
        found: dict[int, set[int]] = {}
        for path in folder.iterdir():
            match = LAYER_FILE.fullmatch(path.name)
            if match:
                found.setdefault(int(match.group(1)), set()).add(int(match.group(2)))
        if len(found) < 3:
            raise ValueError(
                f"{folder}: {len(found)} layer indices in layer_* files; a GPT pipeline has at "
                "least the embedding, one transformer layer and the final norm"
            )
        self.tensor_model_parallel_size = max(max(ranks) for ranks in found.values()) + 1
        indices = sorted(found)
        _missing_ranks(
            folder,
            [self.file(i, t) for i in indices for t in range(self.tensor_model_parallel_size)],
        )
        # An untied head is upstream's LMHeadPipe, the file after the final norm's.
        self.head_index = None
        if any(k.startswith(LM_HEAD) for k in ptfile.load(folder / self.file(indices[-1], 0))):
            self.head_index = indices.pop()
        self.embedding_index, self.final_index = indices[0], indices[-1]
        self.layer_indices = indices[1:-1]
        self.numbering = pipe_numbering(indices)
        if self.numbering is None:
            raise ValueError(
                f"{folder}: layer files {indices} follow neither GPTModelPipe's numbering "
                "(embedding, transformer layers and final norm one apart, as deepspeedai/"
                "Megatron-DeepSpeed writes them, or two apart, as bigscience's fork does)"
            )

    @property
    def num_layers(self) -> int:
        return len(self.layer_indices)

    @staticmethod
    def file(index: int, tp: int) -> str:
        return f"layer_{index:02d}-model_{tp:02d}-model_states.pt"

    def _read(self, index: int, rename: Callable[[str], str]) -> Shards:
        shards = []
        for tp in range(self.tensor_model_parallel_size):
            state = ptfile.load(self.folder / self.file(index, tp))
            shards.append({rename(key): value for key, value in state.items()})
        return shards

    def read_part(self, part: str) -> Shards:
        if part == EMBEDDING:
            return self._read(self.embedding_index, lambda key: "embedding." + key)
        if part == FINAL:
            return self._read(self.final_index, lambda key: "final_layernorm." + key)
        if part == HEAD:
            if self.head_index is None:
                raise ValueError(
                    f"{self.folder}: no layer file holds lm_head.weight, the untied output layer "
                    "the description names"
                )
            return self._read(self.head_index, lambda key: _OUTPUT_PREFIX + key[len(LM_HEAD) :])
        i = int(part.split(".")[1])
        shards = self._read(
            self.layer_indices[i], lambda key: layer_name(i, canonical_layer_key(key))
        )
        for shard in shards:
            for name in [n for n in shard if "self_attention.query_key_value" in n]:
                shard[name] = to_per_head_qkv(shard[name], self.qkv_order, self.rank_heads)
        return shards

    @property
    def rank_heads(self) -> int:
        return self.heads // self.tensor_model_parallel_size

    def where(self, part: str) -> str:
        index = {
            EMBEDDING: self.embedding_index,
            FINAL: self.final_index,
            HEAD: self.head_index,
        }.get(part)
        if index is None:
            index = self.layer_indices[int(part.split(".")[1])]
        return f"{self.folder}/{self.file(index, 0)}"


def _split_by_part(state: dict[str, Any], num_layers: int, *, head: bool) -> dict[str, dict]:
    parts: dict[str, dict] = {name: {} for name in part_names(num_layers, head=head)}
    for name, tensor in state.items():
        if name.startswith(_OUTPUT_PREFIX) and not head:
            raise ValueError(
                f"parameter {name}, an untied output layer, in a model whose description ties "
                "it to the word embeddings (untie_embeddings_and_output_weights off)"
            )
        if name.startswith("embedding."):
            parts[EMBEDDING][name] = tensor
        elif name.startswith("layers."):
            index = int(name.split(".")[1])
            if index >= num_layers:
                raise ValueError(f"parameter {name} beyond the model's {num_layers} layers")
            parts[layer_part(index)][name] = tensor
        elif name in FINAL_NORM:
            parts[FINAL][name] = tensor
        elif name.startswith(_OUTPUT_PREFIX):
            parts[HEAD][name] = tensor
        else:
            raise ValueError(f"unexpected parameter {name}")
    return parts


class PlainEngineFiles:
    """DeepSpeed's plain engine: `mp_rank_YY_model_states.pt` holding the GPT's state dict.

    Each file is opened (memory-mapped) again for every part and let go after it, so the pages
    of the parts already written are not kept mapped."""

    def __init__(
        self,
        folder: Path,
        *,
        tensor_model_parallel_size: int,
        num_layers: int,
        heads: int,
        qkv_order: str,
        head: bool = False,
    ) -> None:
        self.folder, self.tensor_model_parallel_size, self.num_layers = (
            folder,
            tensor_model_parallel_size,
            num_layers,
        )
        self.head = head
        self.rank_heads, self.qkv_order = heads // tensor_model_parallel_size, qkv_order
        _missing_ranks(folder, [self.file(t) for t in range(tensor_model_parallel_size)])
        for tp in range(tensor_model_parallel_size):
            self._module(tp)  # checks every file's names once, up front

    @staticmethod
    def file(tp: int) -> str:
        return f"mp_rank_{tp:02d}_model_states.pt"

    def _module(self, tp: int) -> dict[str, dict]:
        path = self.folder / self.file(tp)
        module = ptfile.load(path).get("module")
        if not isinstance(module, dict):
            raise ValueError(
                f"{path}: holds no model weights ('module' is {type(module).__name__}); a "
                "pipeline checkpoint needs its layer_* files"
            )
        try:
            if "language_model" in module:  # Megatron-DeepSpeed's nested module
                module = flatten_language_model(
                    module["language_model"], heads=self.rank_heads, qkv_order=self.qkv_order
                )
            return _split_by_part(module, self.num_layers, head=self.head)
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None

    def read_part(self, part: str) -> Shards:
        return [self._module(tp)[part] for tp in range(self.tensor_model_parallel_size)]

    def where(self, part: str) -> str:
        return f"{self.folder}/{self.file(0)}"


def qkv_order(state: dict[str, Any], *, where: str) -> str:
    """The QKV row order of a Megatron or Megatron-DeepSpeed file, from its checkpoint_version
    (missing is 0, as Megatron reads it) and, at version >= 2, its args: only commits from
    676a482 on have the `ds_sequence_parallel_fpdt*` arguments, and only they write blocks."""
    version = float(state.get("checkpoint_version") or 0)
    if qkv_order_of_version(version) != QKV_PER_HEAD:
        return qkv_order_of_version(version)
    args = state.get("args")
    if args is None:
        raise ValueError(
            f"{where}: checkpoint_version {version} without Megatron's args; cannot tell whether "
            "its query_key_value rows are per head or [Q|K|V] blocks (Megatron-DeepSpeed from "
            "commit 676a482)"
        )
    fpdt = any(name.startswith("ds_sequence_parallel_fpdt") for name in vars(args))
    return QKV_BLOCKS if fpdt else QKV_PER_HEAD


def to_per_head_qkv(tensor: np.ndarray, order: str, heads: int) -> np.ndarray:
    """One TP rank's query_key_value weight or bias with rows in `order` (an entry of
    mds_model.naming.QKV_ORDERS: its axes), as [np, 3, hn] rows."""
    if order == QKV_PER_HEAD:
        return tensor
    axes = order.split(",")
    sizes = {"np": heads, "3": 3, "hn": tensor.shape[0] // (3 * heads)}
    grouped = tensor.reshape(*(sizes[axis] for axis in axes), *tensor.shape[1:])
    into = [axes.index(axis) for axis in QKV_PER_HEAD.split(",")]
    moved = grouped.transpose(*into, *range(3, grouped.ndim))
    return np.ascontiguousarray(moved).reshape(tensor.shape)


def flatten_language_model(
    language: dict[str, Any], *, heads: int, qkv_order: str, offset: int = 0
) -> dict[str, np.ndarray]:
    """Megatron's nested `language_model` state dict (`embedding` -> `word_embeddings` ->
    `weight`, `encoder` or version 0's `transformer` -> `layers.I.X` with chunk-local I) as plain
    GPT names, the layers numbered from `offset`, QKV rows per head; an untied head's
    `output_layer` -> `weight` as `output_layer.weight`."""
    out = {}
    embedding = language.get("embedding", {})
    for sub in ("word_embeddings", "position_embeddings"):
        for key, tensor in embedding.get(sub, {}).items():  # `weight`, BLOOM's `norm.*`
            out[f"embedding.{sub}.{key}"] = tensor
    for key, tensor in language.get("output_layer", {}).items():
        out[_OUTPUT_PREFIX + key] = tensor
    encoder = language.get("encoder", language.get("transformer", {}))
    for name, tensor in encoder.items():
        if name.startswith("layers."):
            _, index, local = name.split(".", 2)
            local = canonical_layer_key(local)
            if local.startswith("self_attention.query_key_value"):
                tensor = to_per_head_qkv(tensor, qkv_order, heads)
            out[layer_name(offset + int(index), local)] = tensor
        elif name.startswith("final_layernorm."):
            out[name] = tensor
        else:
            raise ValueError(f"unexpected encoder key {name}")
    return out


class MegatronFiles:
    """Plain Megatron: `mp_rank_YY[_ZZZ]/model_optim_rng.pt`, nested `model` dicts (or `model0`,
    `model1`, ... with virtual pipeline stages); the files of the stage holding a part are opened
    (memory-mapped) for that part only.

    With V virtual stages of n layers each over P stages, Megatron's interleaved schedule gives
    chunk c of stage p the layers from c * P * n + p * n (`ParallelTransformer`'s offset:
    c * (L / V) + p * (L / (P * V))); without them stage p's layers follow stage p - 1's."""

    def __init__(self, folder: Path, *, heads: int, head: bool = False) -> None:
        self.folder, self.heads, self.head = folder, heads, head
        ranks = {}
        for path in folder.iterdir():
            match = MEGATRON_RANK_DIR.fullmatch(path.name)
            if match and (path / MEGATRON_FILE).is_file():
                ranks[(int(match.group(1)), int(match.group(2) or 0))] = path
        self.tensor_model_parallel_size = max(tp for tp, _ in ranks) + 1
        self.pipeline_model_parallel_size = max(pp for _, pp in ranks) + 1
        names = [
            self.path(t, p)
            for p in range(self.pipeline_model_parallel_size)
            for t in range(self.tensor_model_parallel_size)
        ]
        _missing_ranks(folder, [str(path.relative_to(folder)) for path in names])
        first = ptfile.load(self.path(0, 0))
        self.qkv_order = qkv_order(first, where=str(self.path(0, 0)))
        self.chunks = _model_chunks(first, self.path(0, 0))
        counts = {
            (pp, c): len(_layer_numbers(self._flatten(pp, 0, c, offset=0)))
            for pp in range(self.pipeline_model_parallel_size)
            for c in range(len(self.chunks))
        }
        self.offsets = {}  # (stage, chunk) -> its first global layer
        if len(self.chunks) == 1:
            start = 0
            for pp in range(self.pipeline_model_parallel_size):
                self.offsets[(pp, 0)] = start
                start += counts[(pp, 0)]
        else:
            per_chunk = counts[(0, 0)]
            if any(count != per_chunk for count in counts.values()):
                raise ValueError(
                    f"{folder}: virtual pipeline chunks hold {sorted(set(counts.values()))} "
                    "layers; Megatron's interleaved schedule gives every chunk the same number"
                )
            for pp, c in counts:
                self.offsets[(pp, c)] = (c * self.pipeline_model_parallel_size + pp) * per_chunk
        self.counts = counts
        self.num_layers = sum(counts.values())

    def path(self, tp: int, pp: int) -> Path:
        name = (
            f"mp_rank_{tp:02d}"
            if self.pipeline_model_parallel_size == 1
            else f"mp_rank_{tp:02d}_{pp:03d}"
        )
        return self.folder / name / MEGATRON_FILE

    def _flatten(self, pp: int, tp: int, chunk: int, *, offset: int) -> dict[str, np.ndarray]:
        path = self.path(tp, pp)
        state = ptfile.load(path)
        key = self.chunks[chunk]
        if key not in state:
            raise ValueError(f"{path}: no {key!r} in the checkpoint ({self.path(0, 0)} has it)")
        language = state[key].get("language_model", state[key])
        try:
            return flatten_language_model(
                language,
                heads=self.heads // self.tensor_model_parallel_size,
                qkv_order=self.qkv_order,
                offset=offset,
            )
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None

    def _chunk_of(self, part: str) -> tuple[int, int]:
        """(stage, chunk) holding a part: the embedding is stage 0's first chunk, the final norm
        the last stage's last chunk."""
        if part == EMBEDDING:
            return 0, 0
        if part in (FINAL, HEAD):
            return self.pipeline_model_parallel_size - 1, len(self.chunks) - 1
        index = int(part.split(".")[1])
        return next(
            where
            for where, start in self.offsets.items()
            if start <= index < start + self.counts[where]
        )

    def read_part(self, part: str) -> Shards:
        pp, chunk = self._chunk_of(part)
        shards = []
        for tp in range(self.tensor_model_parallel_size):
            flat = self._flatten(pp, tp, chunk, offset=self.offsets[(pp, chunk)])
            shards.append(_split_by_part(flat, self.num_layers, head=self.head)[part])
        return shards

    def where(self, part: str) -> str:
        pp, chunk = self._chunk_of(part)
        key = self.chunks[chunk]
        return str(self.path(0, pp)) + ("" if key == "model" else f" [{key}]")


def _model_chunks(state: dict[str, Any], path: Path) -> list[str]:
    """`["model"]`, or Megatron's virtual pipeline chunks `["model0", "model1", ...]`."""
    if "model" in state:
        return ["model"]
    numbers = sorted(int(key[5:]) for key in state if key[:5] == "model" and key[5:].isdigit())
    if not numbers:
        raise ValueError(f"{path}: no 'model' (nor virtual stages 'model0', ...) in the checkpoint")
    if numbers != list(range(len(numbers))):
        raise ValueError(
            f"{path}: virtual pipeline chunks {numbers} are not model0..model{len(numbers) - 1}"
        )
    virtual = getattr(state.get("args"), "virtual_pipeline_model_parallel_size", None)
    if virtual is not None and int(virtual) != len(numbers):
        raise ValueError(
            f"{path}: {len(numbers)} model chunks, virtual_pipeline_model_parallel_size "
            f"{virtual} in Megatron's args"
        )
    return [f"model{n}" for n in numbers]


def _layer_numbers(flat: dict[str, np.ndarray]) -> set[int]:
    return {int(name.split(".")[1]) for name in flat if name.startswith("layers.")}


def is_mp_rank_file(name: str) -> bool:
    return MP_RANK_FILE.fullmatch(name) is not None
