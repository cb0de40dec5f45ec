"""Saving and resuming: DeepSpeed's checkpoint layout, made atomic, described by a meta.json.

Layout (README: "Checkpoints"): `{save}/global_stepN/` holds DeepSpeed's files (layer_XX-model_YY
and mp_rank_XX files, ZeRO partitions), `rng_state_rankRRRRR.pt` per global rank, and `meta.json`
(model config, topology, progress, tokenizer, versions); `{save}/latest` names the newest complete
one. Every rank writes into `global_stepN.partial`; rank 0 renames it into place and only then
rewrites `latest`, so a run killed mid-save leaves `latest` on the previous checkpoint. A checkpoint
mds-merge-mp reshaped to this topology loads its topology-free optimizer state through reshaped.py.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from mds_checkpoint import (
    CLIENT_KEY,
    CLIENT_VERSION,
    DEEPSPEED_TAG,
    LATEST,
    MEGATRON_TRACKER,
    META,
    PARTIAL_SUFFIX,
    UPSTREAM_LAYOUT,
    CheckpointMeta,
    Progress,
    fp8_file,
    locate_checkpoint,
    meta_text,
    read_meta,
    rng_file,
    tag_for,
)
from mds_common.files import (
    WriteFailed,
    fsync_directory,
    remove_stale_temporaries,
    replace_directory,
    reporting_write_failures,
    write_text_atomically,
)
from mds_common.tokenizer_record import TokenizerRecord
from mds_model import GPTConfig
from mds_model.arguments import ARGUMENT_OF, SWIGLU
from mds_model.config import GPT2
from mds_tokenize import check_checkpoint_tokenizer

from .deepspeed_engine import (
    refresh_master_weights,
    set_progress,
    writing_zero3_model_file,
    zero_file_contents,
)
from .fully_sharded import DeepSpeedZero3Files, zero3_module_placeholders
from .rank_files import load_rank_file, unpickling_foreign_classes
from .reshaped import restore_loss_scaler, restore_optimizer_state, restore_zero3
from .sharded_master_weights import ShardedMasterAdamW
from .state import (
    TrainingState,
    capture_rng_states,
    restore_rng_states,
    restore_upstream_rng_state,
    upstream_rng_state,
)

logger = logging.getLogger(__name__)

# Fields that follow from the TP size (the vocabulary is padded to a multiple of
# --make-vocab-size-divisible-by x TP): compared after TP, so a TP change is named as such.
TP_DEPENDENT_FIELDS = ("padded_vocab_size",)
# meta.json's model fields that must match to load weights: GPTConfig's architecture fields, in
# meta.json's names (TP/PP are checked separately).
SHAPE_FIELDS = tuple(
    name for name in GPTConfig.architecture_keys() if name not in TP_DEPENDENT_FIELDS
)
# What a meta.json written before a field existed means by its absence: GPT-2's value, what mds
# computed then (the tanh GeLU, LayerNorm, biases, a tied output layer).
FIELD_DEFAULTS = {name: GPT2[name] for name in SHAPE_FIELDS if name in GPT2}
# The flags that give a run each activation (ModelSection.activation), for the mismatch's error.
_ACTIVATION_FLAGS = {
    "gelu": "add --no-bias-gelu-fusion",
    "gelu_tanh": "drop --no-bias-gelu-fusion and --onnx-safe, or add --openai-gelu",
    "swiglu": f"add {SWIGLU.flag}",
}
TOKENIZER_CHANGE_FLAG = "--allow-tokenizer-change"


@dataclass(frozen=True)
class CheckpointContext:
    """What save and load need from the run, passed explicitly."""

    engine: Any
    rank: int
    world_size: int
    barrier: Callable[[], None]
    rng_tracker: Any
    meta: CheckpointMeta  # the run's description; progress is added per save
    groups: Any = None  # mds_model.ParallelGroups: a reshaped checkpoint's TP slices
    optimizer: Any = None  # the base optimizer (whose param groups carry the learning rate)
    fp8: Any = None  # mds_model.fp8.Fp8Training of an FP8 run: its scaling state is saved per rank
    # The DeepSpeed config the files record where mds-train's ZeRO optimizer stands in for
    # DeepSpeed's (model_setup.recorded_deepspeed_config).
    recorded_ds_config: dict[str, Any] | None = None


def save_checkpoint(context: CheckpointContext, state: TrainingState, save_dir: Path) -> Path:
    """Writes `{save_dir}/global_stepN` completely, then points `latest` at it. A write that
    fails (a full disk) ends the save with one line (`WriteFailed`), its unfinished folder gone
    and `latest` as it was."""
    tag = tag_for(state.iteration)
    partial = save_dir / (tag + PARTIAL_SUFFIX)
    if context.rank == 0:
        with _reporting_save_failures(save_dir, tag):
            save_dir.mkdir(parents=True, exist_ok=True)
            for stale in save_dir.glob("*" + PARTIAL_SUFFIX):
                shutil.rmtree(stale, ignore_errors=True)  # left by a run killed while saving
            remove_stale_temporaries(save_dir / tag)  # an old copy a killed re-save moved aside
    context.barrier()
    client_state = {
        CLIENT_KEY: {"state": state.to_dict(), "version": CLIENT_VERSION},
        **upstream_client_state(context.meta, state),
        "rng_state": upstream_rng_state(context.rng_tracker),
    }
    sharded = sharded_optimizer(context)
    if sharded:  # the model file as DeepSpeed's own ZeRO engine writes it
        client_state.update(
            optimizer=None,
            param_shapes=context.optimizer.param_shapes(),
            ds_config=context.recorded_ds_config,
        )
    zero3 = isinstance(context.optimizer, DeepSpeedZero3Files)
    if zero3:  # one per DP rank, the weights only in the partition files (DeepSpeed's stage 3)
        client_state.update(
            module=zero3_module_placeholders(context.engine.module),
            buffer_names=[],
            frozen_param_shapes=OrderedDict(),
            shared_params={},
            frozen_param_fragments=OrderedDict(),
        )
    with _reporting_save_failures(save_dir, tag):
        dp_rank = context.groups.dp_rank if zero3 else 0
        with writing_zero3_model_file(context.engine, dp_rank, enabled=zero3):
            context.engine.save_checkpoint(
                str(save_dir), tag=partial.name, client_state=client_state, save_latest=False
            )
        if sharded:
            save_optimizer_partition(context, partial)
        torch.save(capture_rng_states(context.rng_tracker), partial / rng_file(context.rank))
        if context.fp8 is not None:
            torch.save(context.fp8.state_dict(), partial / fp8_file(context.rank))
    context.barrier()
    final = save_dir / tag
    if context.rank == 0:
        meta = context.meta.replace(progress=Progress.from_dict(state.to_dict()), tag=tag)
        with _reporting_save_failures(save_dir, tag):
            write_text_atomically(partial / META, meta_text(meta))
            replace_directory(partial, final)  # saving the same iteration again replaces it whole
            write_text_atomically(save_dir / LATEST, tag)
            fsync_directory(save_dir)
    context.barrier()
    logger.info("saved checkpoint %s at iteration %d", final, state.iteration)
    return final


def save_optimizer_partition(context: CheckpointContext, folder: Path) -> None:
    """This rank's ShardedMasterAdamW partition in DeepSpeed's own ZeRO file (the engine's
    `_save_zero_checkpoint`: the optimizer's state dict, the config and DeepSpeed's version)."""
    from mds_checkpoint import zero_optimizer_file

    groups = context.groups
    name = zero_optimizer_file(groups.dp_rank, groups.tp_rank, bf16=True)
    contents = zero_file_contents(context.optimizer.state_dict(), context.recorded_ds_config)
    torch.save(contents, folder / name)


def load_optimizer_partition(
    context: CheckpointContext,
    path: Path,
    *,
    weights_only: bool = False,
    param_shapes: list[dict[str, Any]] | None = None,
) -> None:
    """This rank's partition of a ZeRO checkpoint (DeepSpeed's BF16, ZeRO or stage-3 optimizer's,
    bf16 or fp32, or ours) into ShardedMasterAdamW (ZeRO-1/2) or mds-train's ZeRO-3 (
    whose weights are in it: `weights_only` takes those alone; `param_shapes`, the stage-3
    model file's, names the partitions' parameters)."""
    from mds_checkpoint import zero_optimizer_file

    groups = context.groups
    stage = context.optimizer.stage
    names = [zero_optimizer_file(groups.dp_rank, groups.tp_rank, bf16=b) for b in (True, False)]
    found = [path / name for name in names if (path / name).is_file()]
    if not found:
        remedy = (
            "add --no-load-optim to load the weights only, or reshape it with mds-merge-mp "
            "--with-optimizer"
            if stage != 3
            else "reshape it with mds-merge-mp (add --with-optimizer to keep the optimizer state)"
        )
        raise ValueError(
            f"{path}: no {names[0]} (nor {names[1]}): it holds no ZeRO-{stage} partition for "
            f"data-parallel rank {groups.dp_rank}; {remedy}"
        )
    saved = load_rank_file(found[0])["optimizer_state_dict"]
    saved_at_stage3 = "fp32_flat_groups" in saved  # DeepSpeed's stage-3 state dict key
    if saved_at_stage3 != (stage == 3):
        raise ValueError(
            f"{found[0]}: {'ZeRO-3' if saved_at_stage3 else 'ZeRO-1/2'} optimizer state, this run "
            f"is at ZeRO-{stage}; reshape it with mds-merge-mp --with-optimizer, or add "
            "--no-load-optim"
        )
    try:
        if stage == 3:
            context.optimizer.load_state_dict(
                saved, weights_only=weights_only, param_shapes=param_shapes
            )
        else:
            context.optimizer.load_state_dict(saved)
    except ValueError as error:
        remedy = (
            "reshape it with mds-merge-mp"
            if stage == 3
            else "reshape it with mds-merge-mp --with-optimizer, or add --no-load-optim"
        )
        raise ValueError(f"{found[0]}: {error}; {remedy}") from None


def upstream_client_state(meta: CheckpointMeta, state: TrainingState) -> dict[str, Any]:
    """What Megatron-DeepSpeed's own save_checkpoint puts beside the model, so that its readers
    (upstream, DeepSpeed's ds_to_universal, Megatron's converters) read mds-train's files as
    they are: `checkpoint_version` 3.0 above all (read as 0 when missing, which reorders the
    query/key/value rows mds holds per head), `args`, `iteration`, `tokens`, and the
    vocabulary and parameter patterns of `checkpoint_info` / `universal_checkpoint_info`, the
    scheduler's state (save_checkpoint adds the RNG states)."""
    from mds_checkpoint import upstream_keys

    return upstream_keys(
        meta.config(where="this run"),
        tensor_model_parallel_size=meta.tensor_model_parallel_size,
        pipeline_model_parallel_size=meta.pipeline_model_parallel_size,
        progress=state.to_dict(),
        tokenizer=meta.tokenizer or TokenizerRecord(),
        layout="mds",
        lr_schedule=meta.lr_schedule,  # replaces DeepSpeed's own `lr_scheduler` (None)
    )


# How torch.save's zip writer reports a write that failed: a RuntimeError in its own words
# ("unexpected pos 13327168 vs 13327060" on a full disk), never the OSError.
_TORCH_WRITE_FAILURES = (
    "inline_container",
    "PytorchStreamWriter",
    "unexpected pos",
    "iostream error",
    "cannot be opened",
    "Parent directory",
)


def _torch_write_failed(error: BaseException) -> bool:
    return isinstance(error, RuntimeError) and any(m in str(error) for m in _TORCH_WRITE_FAILURES)


@contextmanager
def _reporting_save_failures(save_dir: Path, tag: str) -> Iterator[None]:
    """A failed write ends the save with one line saying what `latest` still names; the
    unfinished `.partial` folder goes (on a full disk, its space is what the user needs back)."""
    latest = save_dir / LATEST
    try:
        previous = latest.read_text().strip() if latest.is_file() else None
    except OSError:
        previous = None
    kept = f"`latest` still names {previous}" if previous else "no earlier checkpoint there"
    try:
        with reporting_write_failures(
            save_dir,
            doing=f"saving checkpoint {tag} to",
            advice=f"give --save another folder; {kept}",
            writer_error=_torch_write_failed,
        ):
            yield
    except WriteFailed:
        shutil.rmtree(save_dir / (tag + PARTIAL_SUFFIX), ignore_errors=True)
        raise


def find_checkpoint(
    load_dir: Path, *, save_dir: Path | None = None
) -> tuple[Path, CheckpointMeta | None] | None:
    """The checkpoint --load means, as mds-merge-mp and mds-generate read a path (a save folder's
    `latest` one, or one `global_stepN` folder), and its meta.json (None: a checkpoint without
    one, which Megatron-DeepSpeed or Megatron wrote). None only for a --load folder that is also
    --save and has no `latest` yet: the first run of a launch script that passes `--save X
    --load X` on every requeue. Any other --load must hold a checkpoint."""
    requeue = save_dir is not None and load_dir.resolve() == save_dir.resolve()
    if not load_dir.exists():
        if requeue:
            logger.info("no checkpoint in %s yet; starting from scratch", load_dir)
            return None
        raise ValueError(f"{load_dir}: --load folder does not exist")
    pointers = (LATEST, MEGATRON_TRACKER, META)  # Megatron-DeepSpeed's iteration file alone too
    if requeue and not any((load_dir / name).exists() for name in pointers):
        partial = sorted(p.name for p in load_dir.glob("*" + PARTIAL_SUFFIX))
        note = f" (only unfinished saves: {', '.join(partial)})" if partial else ""
        logger.warning("no checkpoint in %s%s; starting from scratch", load_dir, note)
        return None
    path = locate_checkpoint(load_dir).folder
    # None: Megatron-DeepSpeed's or Megatron's own files (upstream.py)
    return path, read_meta(path)


def with_checkpoint_padding(
    gpt_config: GPTConfig,
    meta: CheckpointMeta,
    *,
    rows_given: bool,
    tensor_model_parallel_size: int,
) -> GPTConfig:
    """The run's model padded to the checkpoint's vocabulary rows where no --pad-vocab-size-to
    was given (`rows_given`): mds-merge-mp keeps a checkpoint's rows (Megatron trains its padding
    rows) when it reshapes to another TP that divides them (a TP=2 GPT-2 has 50432 rows, TP=1
    pads to 50304)."""
    model = meta.model
    rows = model.get("pad_vocab_size_to")
    if rows is None and model.get("vocab_size") == model.get("padded_vocab_size"):
        # Plain Megatron records no unpadded size: its rows stood in for it, and this run's
        # tokenizer says how many of them are real tokens.
        rows = model.get("padded_vocab_size")
    tp = tensor_model_parallel_size
    if (
        rows
        and not rows_given
        and rows != gpt_config.padded_vocab_size
        and rows >= gpt_config.vocab_size
        and rows % tp == 0
    ):
        logger.info("vocabulary padded to the checkpoint's %d rows", rows)
        return dataclasses.replace(gpt_config, pad_vocab_size_to=rows)
    return gpt_config


def check_readable(path: Path, meta: CheckpointMeta, *, loads_optimizer: bool) -> None:
    """Every torch file the load reads is whole (mds-merge-mp's check: its zip directory is
    there), so that a copy cut short fails here in one line naming the file, not in DeepSpeed's
    load (66 lines, no file named). Reads only each file's directory. Without the optimizer
    state (--no-load-optim, --finetune) DeepSpeed reads no ZeRO-1/2 partition file, so a damaged
    one does not stop the load; ZeRO-3's partitions hold the weights and are always read."""
    from mds_checkpoint import ZERO_OPTIMIZER_FILE
    from mds_checkpoint import check_pt_file as check

    skip_partitions = not loads_optimizer and meta.parallel.zero_stage != 3
    for file in sorted(path.rglob("*.pt")):
        if skip_partitions and ZERO_OPTIMIZER_FILE.fullmatch(file.name):
            continue
        try:
            check(file)
        except ValueError as error:
            earlier = _earlier_checkpoints(path)
            remedy = (
                f"write {earlier[-1]} into {path.parent / LATEST} to load the one before"
                if earlier
                else "copy it again"
            )
            raise ValueError(
                f"{error}; the checkpoint is damaged or incomplete: {remedy}"
            ) from None


def _earlier_checkpoints(path: Path) -> list[str]:
    """The complete checkpoints beside `path` from earlier iterations, oldest first."""
    found = []
    for folder in path.parent.iterdir():
        match = DEEPSPEED_TAG.fullmatch(folder.name)
        if match and (folder / META).is_file() and folder.name != path.name:
            found.append((int(match.group(1)), folder.name))
    current = DEEPSPEED_TAG.fullmatch(path.name)
    limit = int(current.group(1)) if current else None
    return [name for number, name in sorted(found) if limit is None or number < limit]


def reshaped_optimizer(meta: CheckpointMeta) -> bool:
    """mds-merge-mp wrote the optimizer state topology-free (loadable at any DP)."""
    return meta.optimizer_layout == "universal"


def check_compatible(
    meta: CheckpointMeta,
    run_meta: CheckpointMeta,
    *,
    path: Path,
    loads_optimizer: bool,
    tokenizer_change_allowed: bool = False,
) -> None:
    """The checkpoint's model, tokenizer and topology against this run's; one line says what
    differs."""
    if meta.reshaped is not None and loads_optimizer:
        if not reshaped_optimizer(meta):
            raise ValueError(
                f"{path}: reshaped by mds-merge-mp without --with-optimizer, so it holds no "
                "optimizer state; add --no-load-optim (or --finetune), or reshape again with "
                "--with-optimizer"
            )
    check_model_fields(meta, run_meta, SHAPE_FIELDS, path)
    check_tokenizer(meta, run_meta, path, change_allowed=tokenizer_change_allowed)
    saved, current = meta.parallel, run_meta.parallel
    for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size"):
        if getattr(saved, key) != getattr(current, key):
            flag = "--" + key.replace("_", "-")
            tp, pp = current.tensor_model_parallel_size, current.pipeline_model_parallel_size
            raise ValueError(
                f"{path}: saved with TP={saved.tensor_model_parallel_size}, "
                f"PP={saved.pipeline_model_parallel_size} but this run has TP={tp}, PP={pp}; "
                "reshape it with mds-merge-mp merge "
                f"--target-tensor-model-parallel-size {tp} --target-pipeline-model-parallel-size "
                f"{pp} --with-optimizer, or change {flag}"
            )
    check_model_fields(meta, run_meta, TP_DEPENDENT_FIELDS, path)
    saved_stage, current_stage = saved.zero_stage, current.zero_stage
    if meta.reshaped is None and (saved_stage == 3) != (current_stage == 3):
        _check_zero3_crossing(saved_stage, current_stage, path, loads_optimizer)
    if (
        loads_optimizer
        and not reshaped_optimizer(meta)
        and saved.zero_stage > 0
        and saved.data_parallel_size != current.data_parallel_size
    ):
        raise ValueError(
            f"{path}: its ZeRO optimizer state is split over {saved.data_parallel_size} "
            f"data-parallel ranks, this run has {current.data_parallel_size}; add --no-load-optim "
            "or reshape it "
            "with mds-merge-mp --with-optimizer"
        )


def check_tokenizer(
    meta: CheckpointMeta, run_meta: CheckpointMeta, path: Path, *, change_allowed: bool
) -> None:
    """The tokenizer flags name the one the checkpoint was trained with (mds_tokenize's one
    check), and every id has one of its embedding rows; --allow-tokenizer-change lets another
    tokenizer through whose ids fit."""
    check_checkpoint_tokenizer(
        meta.tokenizer or TokenizerRecord(),
        run_meta.tokenizer or TokenizerRecord(),
        checkpoint=f"--load {path}",
        model_rows=meta.model.get("padded_vocab_size"),
        change_flag=TOKENIZER_CHANGE_FLAG,
        change_allowed=change_allowed,
    )


def check_model_fields(
    meta: CheckpointMeta, run_meta: CheckpointMeta, names: tuple[str, ...], path: Path
) -> None:
    for name in names:
        default = FIELD_DEFAULTS.get(name)
        theirs, ours = meta.model.get(name, default), run_meta.model.get(name, default)
        if theirs != ours:
            fix = "train with the checkpoint's model flags"
            if name == "activation" and theirs in _ACTIVATION_FLAGS:
                fix = f"{_ACTIVATION_FLAGS[theirs]} (the flags of the run that wrote it)"
            elif name in _FLAG_FIXED:
                fix = f"{_flag_fix(name, theirs)} (the flags of the run that wrote it)"
            if name == "padded_vocab_size":
                fix = _padding_fix(meta.model, rows=theirs)
            raise ValueError(
                f"{path}: {name} is {theirs} in the checkpoint but {ours} in this run; {fix}"
            )


# The Llama family's fields, each given by its upstream flag (mds_model.arguments' rows).
_FLAG_FIXED = (
    "normalization",
    "num_query_groups",
    "add_bias_linear",
    "untie_embeddings_and_output_weights",
    "rotary_percent",
)


def _flag_fix(name: str, value: Any) -> str:
    """The flag that gives a run the checkpoint's `value` of field `name`."""
    flag = ARGUMENT_OF[name].flag
    if name == "add_bias_linear":  # the flag turns the biases off
        return f"add {flag}" if value is False else f"drop {flag}"
    if isinstance(value, bool):
        return f"add {flag}" if value else f"drop {flag}"
    if value is None:  # num_query_groups: one group per head
        return f"drop {flag}"
    return f"give {flag} {value}"


def _padding_fix(model: dict[str, Any], *, rows: int) -> str:
    """The flags that give this run the checkpoint's embedding rows: Megatron pads the vocabulary
    to a multiple of --make-vocab-size-divisible-by x TP, or to --pad-vocab-size-to."""
    if model.get("pad_vocab_size_to") is not None:
        return f"add --pad-vocab-size-to {rows} (the checkpoint's)"
    divisible = model.get("make_vocab_size_divisible_by")
    if divisible is None:
        return f"add --pad-vocab-size-to {rows}"
    return (
        f"give --make-vocab-size-divisible-by {divisible} (the checkpoint's) or "
        f"--pad-vocab-size-to {rows}"
    )


def _check_zero3_crossing(saved: int, current: int, path: Path, loads_optimizer: bool) -> None:
    """Between ZeRO-3 and the other stages DeepSpeed's loader finds nothing to read: a ZeRO-3
    checkpoint's weights exist only in its partition files, and a ZeRO-3 run looks for those.
    Only the weights of a stage 0-2 checkpoint go into a ZeRO-3 run (`load_checkpoint`)."""
    if saved == 3:
        raise ValueError(
            f"{path}: saved at ZeRO-3, whose weights exist only in its partition files, but this "
            f"run is at ZeRO-{current}; reshape it with mds-merge-mp (add --with-optimizer to keep "
            "the optimizer state), or run at --zero-stage 3"
        )
    if loads_optimizer:
        raise ValueError(
            f"{path}: its optimizer state was saved at ZeRO-{saved} and this run is at ZeRO-3; "
            "add --no-load-optim to load the weights only, or reshape it with mds-merge-mp "
            "--with-optimizer"
        )


def load_checkpoint(
    context: CheckpointContext,
    found: tuple[Path, CheckpointMeta],
    *,
    load_optimizer: bool,
    load_rng: bool,
    finetune: bool,
) -> TrainingState:
    """Restores weights (and optimizer, progress, RNG as asked) from `find_checkpoint`'s result,
    already checked with `check_compatible`."""
    path, meta = found
    load_optimizer = load_optimizer and not finetune
    # A reshaped checkpoint's optimizer state is topology-free: reshaped.py fills this rank's
    # optimizer from it. DeepSpeed's stage 3 reads only its own partition files, so at ZeRO-3
    # reshaped.py puts the weights into the partitions as well.
    universal = load_optimizer and reshaped_optimizer(meta)
    # A stage 0-2 checkpoint's mp_rank files hold its weights as a reshaped one's do.
    into_zero3 = meta.reshaped is not None or meta.parallel.zero_stage != 3
    if not into_zero3 and isinstance(context.optimizer, DeepSpeedZero3Files):
        client_state = _load_zero3_files(context, path, load_optimizer=load_optimizer)
    elif into_zero3 and context.meta.parallel.zero_stage == 3:
        client_state = restore_zero3(
            context.engine,
            context.groups,
            path,
            num_layers=meta.model["num_layers"],
            with_optimizer=universal,
        )
        what = "weights and optimizer state" if universal else "weights"
        logger.info("%s of %s restored into the ZeRO-3 partitions", what, path)
    else:
        client_state = _load_through_deepspeed(
            context, path, meta, load_optimizer=load_optimizer, universal=universal
        )
    if finetune:
        logger.info("loaded weights of %s for fine-tuning; iteration and data start at 0", path)
        return TrainingState()
    upstream = meta.layout == UPSTREAM_LAYOUT
    if upstream:  # progress as mds_checkpoint read it from upstream's iteration, args and tokens
        state = TrainingState.from_dict(meta.progress.to_dict())
        logger.info(
            "%s: Megatron-DeepSpeed's files at this run's layout, loaded as they are%s",
            path,
            " (with its ZeRO optimizer state)" if load_optimizer else "",
        )
    elif client_state is None or CLIENT_KEY not in client_state:
        raise ValueError(f"{path}: the DeepSpeed files hold no mds-train progress")
    else:
        state = TrainingState.from_dict(client_state[CLIENT_KEY]["state"])
    if universal or (load_optimizer and sharded_optimizer(context)):
        # as DeepSpeed's own optimizer load would have set them
        set_progress(
            context.engine,
            iteration=state.iteration,
            consumed_samples=state.consumed_train_samples,
        )
    if universal:
        record = meta.optimizer.get("loss_scaler")
        if restore_loss_scaler(context.engine.optimizer, record):
            logger.info(
                "fp16 loss scale %s restored (iteration %d of the scaler, last overflow at %d)",
                record["cur_scale"],
                record["cur_iter"],
                record["last_overflow_iter"],
            )
    if load_rng and meta.reshaped is not None:
        logger.warning(
            "%s was reshaped by mds-merge-mp: per-rank RNG states do not carry over to another "
            "topology; dropout and other random draws continue from the seed",
            path,
        )
        load_rng = False
    if load_rng and upstream:
        if not (client_state or {}).get("rng_state"):
            raise ValueError(f"{path}: no rng_state in its rank files; add --no-load-rng")
        restore_upstream_rng_state(client_state["rng_state"], context.rng_tracker)
    elif load_rng:
        rng_path = path / rng_file(context.rank)
        if meta.parallel.world_size != context.world_size or not rng_path.is_file():
            raise ValueError(
                f"{path}: no RNG state for rank {context.rank} of {context.world_size} (saved by "
                f"{meta.parallel.world_size} ranks); add --no-load-rng"
            )
        restore_rng_states(torch.load(rng_path, weights_only=False), context.rng_tracker)
    if context.fp8 is not None:
        restore_fp8_scaling(context, path, meta)
    logger.info("resumed from %s at iteration %d", path, state.iteration)
    return state


def restore_fp8_scaling(context: CheckpointContext, path: Path, meta: CheckpointMeta) -> None:
    """An FP8 run resumes its scales where the saved run left them; without them (a 16-bit
    checkpoint, another layout) the scaling starts afresh, as on a first step, and says so."""
    saved = path / fp8_file(context.rank)
    if meta.parallel.world_size != context.world_size or not saved.is_file():
        why = "it has no FP8 scaling state for this rank"
    else:
        why = context.fp8.load_state_dict(torch.load(saved, weights_only=True))
    if why is not None:
        logger.warning("%s: %s; FP8 scales start afresh from the next step's amaxes", path, why)


def sharded_optimizer(context: CheckpointContext) -> bool:
    """mds-train's ZeRO optimizers, which read and write DeepSpeed's partition files themselves."""
    return isinstance(context.optimizer, ShardedMasterAdamW | DeepSpeedZero3Files)


def _load_zero3_files(
    context: CheckpointContext, path: Path, *, load_optimizer: bool
) -> dict[str, Any]:
    """A ZeRO-3 checkpoint (DeepSpeed's stage 3's or FullyShardedAdamW's) into mds-train's ZeRO-3:
    this rank's model file's client state, and its partitions (the weights, with the optimizer
    state unless not `load_optimizer`); saved at this run's DP."""
    from mds_checkpoint import zero3_model_file

    groups = context.groups
    model_file = path / zero3_model_file(groups.dp_rank, groups.tp_rank)
    if not model_file.is_file():
        raise ValueError(
            f"{path}: no {model_file.name}: it was saved at another data-parallel size; reshape "
            "it with mds-merge-mp (add --with-optimizer to keep the optimizer state)"
        )
    client_state = load_rank_file(model_file)
    load_optimizer_partition(context, path, weights_only=not load_optimizer,
                             param_shapes=client_state.get("param_shapes"))  # fmt: skip
    return client_state


def _load_through_deepspeed(
    context: CheckpointContext,
    path: Path,
    meta: CheckpointMeta,
    *,
    load_optimizer: bool,
    universal: bool,
) -> dict[str, Any] | None:
    """DeepSpeed loads its files (only the weights when `universal`: reshaped.py then fills the
    optimizer, nor when ShardedMasterAdamW reads its partition file itself); returns the client
    state."""
    partition = load_optimizer and not universal and sharded_optimizer(context)
    try:
        with unpickling_foreign_classes(context.engine):
            _, client_state = context.engine.load_checkpoint(
                str(path.parent),
                tag=path.name,
                load_optimizer_states=load_optimizer and not (universal or partition),
                load_lr_scheduler_states=False,
                load_module_only=not load_optimizer or universal or partition,
            )
    except ValueError as error:  # torch's Optimizer.load_state_dict, under DeepSpeed's stage 3
        if "number of parameter groups" not in str(error):
            raise
        raise ValueError(
            f"{path}: its ZeRO-3 partitions hold upstream's one parameter group (mds-train's bf16 "
            "ZeRO-3 and upstream's own write them so), DeepSpeed's stage 3 in this run keeps "
            "two; reshape it with mds-merge-mp --with-optimizer and --load that"
        ) from None
    if not load_optimizer:  # fp32 master copies follow the loaded weights
        refresh_master_weights(context.engine)
    if partition:
        load_optimizer_partition(context, path)
    if universal:
        step = restore_optimizer_state(
            context.engine,
            context.optimizer,
            context.groups,
            path,
            num_layers=meta.model["num_layers"],
        )
        logger.info("optimizer state of %s restored at step %d (reshaped)", path, step)
    return client_state
