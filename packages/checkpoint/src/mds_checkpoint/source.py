"""One source checkpoint opened for reading: its folder, model, topology, progress and a reader.

`open_source(path)` locates the folder (`locate.py`), reads what the model is (mds-train's
`meta.json`, else Megatron's `args`, `describe.py`) and picks the reader of its layout
(`sources.py`). `merged_part(source, part)` gives one part's whole tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from mds_common.tokenizer_record import TokenizerRecord
from mds_model import GPTConfig
from mds_model.naming import QKV_PER_HEAD, split_of
from mds_model.parameters import (
    GATED,
    Param,
    embedding_parameters,
    final_parameters,
    head_parameters,
    layer_parameters,
)

from . import ptfile
from .describe import config_from_megatron_args, up_first_of_args
from .engine_names import megatron_to_plain, pipeline_to_plain
from .layout import LAYER_FILE, MEGATRON_FILE, META, MP_RANK_FILE, ZERO3_MODEL_FILE
from .locate import locate_checkpoint
from .meta import CheckpointMeta, Parallel, Progress, model_fields, read_meta
from .partition import BufferPool, merge_shards
from .sources import (
    EMBEDDING,
    FINAL,
    HEAD,
    LayerFiles,
    MegatronFiles,
    PlainEngineFiles,
    part_names,
    qkv_order,
    to_per_head_qkv,
)
from .upstream_state import scheduler_progress


@dataclass(frozen=True)
class Source:
    """A checkpoint to read: `config` is the model at the source's TP size."""

    folder: Path
    layout: str  # "pipeline", "plain", "zero3" or "megatron"
    config: GPTConfig
    tensor_model_parallel_size: int
    pipeline_model_parallel_size: int
    meta: CheckpointMeta
    reader: Any  # sources.LayerFiles | PlainEngineFiles | MegatronFiles | zero3.Zero3Files
    qkv_order: str = QKV_PER_HEAD  # of the files' query_key_value rows (sources.qkv_order)
    # each TP rank's gated dense_h_to_4h rows are [up_r; gate_r] (bigscience's --glu-activation),
    # not [gate_r; up_r] (deepspeedai's --swiglu, mds's)
    up_first: bool = False

    @property
    def iteration(self) -> int:
        return self.meta.iteration

    def plain_name(self, engine_name: str) -> str:
        """The plain GPT name of a parameter as the source's DeepSpeed engine named it (in its
        optimizer partitions' `param_slice_mappings`)."""
        if self.layout == "pipeline":
            return pipeline_to_plain(engine_name, self.config.num_layers, self.reader.numbering)
        if engine_name.startswith("language_model."):
            return megatron_to_plain(engine_name)
        return engine_name

    def own_rows(self, plain_name: str, tensor: np.ndarray) -> np.ndarray:
        """One TP rank's tensor (a weight or its optimizer state) with its rows in mds's order:
        QKV rows per head (per key/value group), a gated MLP's [gate_r; up_r]."""
        if "self_attention.query_key_value" in plain_name:
            heads = self.config.num_attention_heads // self.tensor_model_parallel_size
            return to_per_head_qkv(tensor, self.qkv_order, heads)
        return self.gate_first(plain_name, tensor)

    def gate_first(self, plain_name: str, tensor: np.ndarray) -> np.ndarray:
        """A gated dense_h_to_4h shard as [gate_r; up_r] (bigscience's halves swapped)."""
        if not self.up_first or split_of(plain_name, self.config).kind != GATED:
            return tensor
        up, gate = np.split(tensor, 2, axis=0)
        return np.concatenate([gate, up])

    def parts(self) -> list[str]:
        return part_names(
            self.config.num_layers, head=self.config.untie_embeddings_and_output_weights
        )


def vocabulary_info(state: dict[str, Any]) -> dict | None:
    """Where a Megatron file records the tokenizer's unpadded vocabulary size: bigscience's
    `checkpoint_info`, else DeepSpeed's `universal_checkpoint_info` (which deepspeedai/
    Megatron-DeepSpeed writes instead; both name it `original_vocab_size`)."""
    for key in ("checkpoint_info", "universal_checkpoint_info"):
        info = state.get(key)
        if isinstance(info, dict) and info.get("original_vocab_size"):
            return info
    return None


def megatron_meta(state: dict[str, Any], config: GPTConfig, tp: int, pp: int) -> CheckpointMeta:
    """The description of a checkpoint that has no meta.json (Megatron, Megatron-DeepSpeed),
    from one of its rank files: DeepSpeed's also say the ZeRO stage (`ds_config`) and the
    data-parallel size they were written at."""
    args = state.get("args")
    iteration = state.get("iteration", state.get("global_steps", 0))
    samples = int(getattr(args, "consumed_train_samples", 0) or 0)
    progress = {
        "iteration": int(iteration) if str(iteration).isdigit() else 0,
        "consumed_train_samples": samples,
        "consumed_valid_samples": int(getattr(args, "consumed_valid_samples", 0) or 0),
        "consumed_train_tokens": int(state.get("tokens", 0) or 0),
        "lr_samples": samples,
    }
    # The scheduler's state_dict (DeepSpeed's `lr_scheduler`, Megatron's `opt_param_scheduler`)
    # as meta.json's `lr_schedule`, where mds-train records its own and checks a resume.
    schedule = state.get("lr_scheduler") or state.get("opt_param_scheduler")
    lr_schedule = None
    if isinstance(schedule, dict):
        lr_schedule = {key: _plain(value) for key, value in schedule.items()}
        # Its counters are the schedule's progress (consumed samples count skipped steps too).
        progress.update(scheduler_progress(lr_schedule))
    megatron_tokenizer = None
    if getattr(args, "tokenizer_type", None):
        megatron_tokenizer = TokenizerRecord.of(
            type=args.tokenizer_type,
            vocab_file=getattr(args, "vocab_file", None),
            merge_file=getattr(args, "merge_file", None),
            # upstream's SentencePiece / HFTokenizer file (`--tokenizer-model`)
            tokenizer_file=getattr(args, "tokenizer_model", None),
            vocab_size=config.vocab_size,
        )
    zero = (state.get("ds_config") or {}).get("zero_optimization") or {}
    data_parallel = state.get("dp_world_size")
    parallel = Parallel(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        data_parallel_size=None if data_parallel is None else int(data_parallel),
        zero_stage=int(zero.get("stage", 0)),
    )
    return CheckpointMeta(
        model=model_fields(config),
        parallel=parallel,
        precision=config.params_dtype,
        progress=Progress.from_dict(progress),
        megatron_tokenizer=megatron_tokenizer,
        lr_schedule=lr_schedule,
    )


def _plain(value: Any) -> Any:
    """A pickled number (a numpy scalar as ptfile reads it) as JSON's."""
    return value.item() if hasattr(value, "item") else value


def _deepspeed_source(folder: Path) -> Source:
    names = [p.name for p in folder.iterdir()]
    mp_files = sorted(n for n in names if MP_RANK_FILE.fullmatch(n))
    # At ZeRO-3 DeepSpeed writes the module's placeholders and the client state (upstream's args)
    # into one zero_pp_rank_D_mp_rank_TT_model_states.pt per rank instead of mp_rank_TT files.
    zero3_files = sorted(
        n for n in names if (match := ZERO3_MODEL_FILE.fullmatch(n)) and match.group(1) == "0"
    )
    has_layers = any(LAYER_FILE.fullmatch(n) for n in names)
    meta = read_meta(folder)
    if meta is not None:
        config = meta.config(where=str(folder / META))
        tp, pp = meta.tensor_model_parallel_size, meta.pipeline_model_parallel_size
        order, up_first = QKV_PER_HEAD, False
    else:
        described_by = mp_files or zero3_files
        if not described_by:
            raise ValueError(f"{folder}: no {META} and no mp_rank_*_model_states.pt describe it")
        state = ptfile.load(folder / described_by[0])
        if state.get("args") is None:
            raise ValueError(
                f"{folder}: neither {META} (mds-train) nor Megatron's args in {described_by[0]}; "
                "cannot tell the model's shape"
            )
        tp = int(getattr(state["args"], "tensor_model_parallel_size", 1) or 1)
        pp = int(getattr(state["args"], "pipeline_model_parallel_size", 1) or 1)
        config = config_from_megatron_args(
            state["args"],
            checkpoint_info=vocabulary_info(state),
            tensor_model_parallel_size=tp,
            where=str(folder / described_by[0]),
        )
        meta = megatron_meta(state, config, tp, pp)
        order = qkv_order(state, where=str(folder / described_by[0]))
        _check_qkv_order(config, order, where=str(folder / described_by[0]))
        up_first = up_first_of_args(state["args"])
        if meta.parallel.zero_stage == 3 and order != QKV_PER_HEAD:
            raise ValueError(  # upstream's ZeRO-3 files: the weights are in the fp32 partitions
                f"{folder / described_by[0]}: ZeRO-3 partitions with query_key_value rows "
                f"ordered {order}, not per head; mds reads such rows from mp_rank or layer "
                "files only"
            )
    heads = config.num_attention_heads
    if has_layers:
        reader = LayerFiles(folder, heads=heads, qkv_order=order)
        layout = "pipeline"
        if reader.tensor_model_parallel_size != tp:
            raise ValueError(
                f"{folder}: layer files for {reader.tensor_model_parallel_size} tensor-parallel "
                f"ranks, the description says {tp}"
            )
    elif meta.parallel.zero_stage == 3:
        from .zero3 import Zero3Files

        reader = Zero3Files(folder, tensor_model_parallel_size=tp, config=config)
        layout = "zero3"
    else:
        reader = PlainEngineFiles(
            folder,
            tensor_model_parallel_size=tp,
            num_layers=config.num_layers,
            heads=heads,
            qkv_order=order,
            head=config.untie_embeddings_and_output_weights,
        )
        layout = "plain"
    if layout != "pipeline" and pp != 1:
        raise ValueError(f"{folder}: PP={pp} in the description but no layer_* files")
    if layout == "pipeline" and (reader.head_index is not None) != (
        config.untie_embeddings_and_output_weights
    ):
        raise ValueError(
            f"{folder}: the layer files {'hold' if reader.head_index else 'lack'} an untied "
            f"output layer (lm_head.weight), the description says "
            f"untie_embeddings_and_output_weights={config.untie_embeddings_and_output_weights}"
        )
    return Source(folder, layout, config, tp, pp, meta, reader, qkv_order=order, up_first=up_first)


def _check_qkv_order(config: GPTConfig, order: str, *, where: str) -> None:
    """Grouped-query attention's rows are grouped per key/value head ([groups, heads/groups + 2,
    hn], upstream up to 6acc370a); no other order of them is defined."""
    if order != QKV_PER_HEAD and config.query_groups != config.num_attention_heads:
        raise ValueError(
            f"{where}: {config.query_groups} key/value heads for {config.num_attention_heads} "
            f"query heads with query_key_value rows ordered {order}: grouped-query attention's "
            "rows are read only grouped per key/value head (Megatron-DeepSpeed before 676a482); "
            "this checkpoint's layout cannot be told"
        )


def _megatron_source(folder: Path) -> Source:
    first_dir = sorted(p for p in folder.iterdir() if (p / MEGATRON_FILE).is_file())[0]
    state = ptfile.load(first_dir / MEGATRON_FILE)
    if state.get("args") is None:
        raise ValueError(f"{first_dir / MEGATRON_FILE}: no Megatron args; cannot tell the model")
    tp_guess = int(getattr(state["args"], "tensor_model_parallel_size", 1) or 1)
    config = config_from_megatron_args(
        state["args"],
        checkpoint_info=vocabulary_info(state),
        tensor_model_parallel_size=tp_guess,
        where=str(first_dir / MEGATRON_FILE),
    )
    reader = MegatronFiles(
        folder,
        heads=config.num_attention_heads,
        head=config.untie_embeddings_and_output_weights,
    )
    _check_qkv_order(config, reader.qkv_order, where=str(first_dir / MEGATRON_FILE))
    if reader.tensor_model_parallel_size != tp_guess:  # the files' TP pads an unrecorded vocabulary
        config = config_from_megatron_args(
            state["args"],
            checkpoint_info=vocabulary_info(state),
            tensor_model_parallel_size=reader.tensor_model_parallel_size,
            where=str(first_dir / MEGATRON_FILE),
        )
    if reader.num_layers != config.num_layers:
        raise ValueError(
            f"{folder}: {reader.num_layers} layers in the files, num_layers {config.num_layers} "
            "in Megatron's args"
        )
    # mds-merge-mp's --target-layout megatron leaves its meta.json beside (tokenizer, progress)
    meta = read_meta(folder) or megatron_meta(
        state, config, reader.tensor_model_parallel_size, reader.pipeline_model_parallel_size
    )
    return Source(
        folder,
        "megatron",
        config,
        reader.tensor_model_parallel_size,
        reader.pipeline_model_parallel_size,
        meta,
        reader,
        qkv_order=reader.qkv_order,
        up_first=up_first_of_args(state["args"]),
    )


def open_source(path: str | Path, *, iteration: int | None = None) -> Source:
    """The checkpoint at `path` (a save folder or one checkpoint folder), ready to read."""
    located = locate_checkpoint(Path(path), iteration=iteration)
    if located.kind == "megatron":
        source = _megatron_source(located.folder)
    else:
        source = _deepspeed_source(located.folder)
    if (
        isinstance(source.reader, LayerFiles)
        and source.reader.num_layers != source.config.num_layers
    ):
        raise ValueError(
            f"{source.folder}: layer files hold {source.reader.num_layers} transformer layers, "
            f"the description says num_layers {source.config.num_layers}"
        )
    return source


def part_parameters(config: GPTConfig, part: str) -> tuple[Param, ...]:
    """The rows of mds_model's parameter table one part holds (names and whole shapes)."""
    if part == EMBEDDING:
        return embedding_parameters(config)
    if part == FINAL:
        return final_parameters(config)
    if part == HEAD:
        return head_parameters(config)
    return layer_parameters(config, int(part.split(".")[1]))


def merged_part(
    source: Source, part: str, *, buffers: BufferPool | None = None
) -> dict[str, np.ndarray]:
    """One part's whole tensors (TP shards joined, into `buffers`' tensors if given; the word
    embeddings keep the source's padded rows), in `GPT.named_parameters()` order; shapes checked
    against the source's config."""
    shards = [
        {name: source.gate_first(name, tensor) for name, tensor in shard.items()}
        for shard in source.reader.read_part(part)
    ]
    where = source.reader.where(part)
    params = part_parameters(source.config, part)
    wanted = [param.name for param in params]
    for rank, shard in enumerate(shards):
        missing = [name for name in wanted if name not in shard]
        extra = [name for name in shard if name not in wanted]
        if missing or extra:
            problem = f"lacks {missing[0]}" if missing else f"has unexpected {extra[0]}"
            raise ValueError(f"{where}: TP rank {rank} {problem} for this model")
    allocate = buffers.take if buffers is not None else None
    merged = {
        name: merge_shards(
            name, [s[name] for s in shards], config=source.config, where=where, allocate=allocate
        )
        for name in wanted
    }
    for param in params:
        shape = tuple(merged[param.name].shape)
        if shape != param.shape:
            raise ValueError(
                f"{where}: {param.name} is {shape} after joining the TP shards, expected "
                f"{param.shape} for this model"
            )
    return merged
