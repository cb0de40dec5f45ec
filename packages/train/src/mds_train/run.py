"""`run(config)`: one training run from a resolved config, on every rank of the job."""

from __future__ import annotations

import dataclasses
import json
import logging
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from mds_checkpoint import CheckpointMeta, Parallel, model_fields
from mds_common.files import FolderInUse, FolderLock, write_text_atomically
from mds_common.sidecar import distribution_version
from mds_indexed_data import parse_data_path
from mds_model import GPTConfig
from mds_tokenize import check_dataset_tokenizer

from .checkpointing import (
    CheckpointContext,
    check_compatible,
    check_readable,
    find_checkpoint,
    load_checkpoint,
    with_checkpoint_padding,
)
from .config import Topology, TrainConfig
from .data import Vocabulary, build_datasets, read_vocabulary
from .deepspeed_engine import check_version as check_deepspeed_version
from .distributed import (
    LaunchInfo,
    another_process_left,
    device,
    init_distributed,
    launch_environment,
)
from .ds_config import deepspeed_loads_universal, deepspeed_optimizer_problem, effective_zero_stage
from .ds_file import load_user_config, resolve_user_config
from .fallbacks import choose_backend, without_fp16
from .loop import Trainer
from .metrics import MetricsWriter, default_peak_tflops
from .model_setup import build_training_setup, capture_layer_graphs, recorded_deepspeed_config
from .profiling import StepProfiler
from .scheduler_record import resolve_schedule, scheduler_progress
from .state import TrainingState
from .universal_load import check_universal_compatible, find_universal_checkpoint, load_universal
from .upstream import convert_upstream, loadable_as_is, needs_conversion, remove_converted

logger = logging.getLogger(__name__)

EXIT_FAILED = 1  # mds_common.cli's code for a run that failed
FOLDER_LOCK = ".mds-train.lock"  # in --save and --output-dir while a run writes there


def run_description(
    config: TrainConfig, topology: Topology, model: GPTConfig, vocab: Vocabulary
) -> CheckpointMeta:
    """meta.json's fixed part: what the checkpoint is, whatever iteration it holds."""
    return CheckpointMeta(
        tool="mds-train",
        version=distribution_version("mds-train"),
        versions={name: distribution_version(name) for name in ("mds-model", "deepspeed", "torch")},
        model=model_fields(model),
        parallel=Parallel(
            world_size=topology.world_size,
            tensor_model_parallel_size=topology.tensor_model_parallel_size,
            pipeline_model_parallel_size=topology.pipeline_model_parallel_size,
            data_parallel_size=topology.data_parallel_size,
            zero_stage=effective_zero_stage(config, topology),
            engine="pipeline" if topology.pipeline_model_parallel_size > 1 else "plain",
        ),
        precision=config.params_dtype,
        tokenizer=vocab.meta_record(),
        data_path=list(config.data.data_path),
    )


def _configure_logging(rank: int) -> None:
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format="%(message)s" if rank == 0 else f"[rank {rank}] %(message)s",
        stream=sys.stderr,
        force=True,
    )
    for noisy in ("DeepSpeed", "deepspeed", "torch.distributed"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _check_datasets(config: TrainConfig, vocab: Vocabulary) -> None:
    """Every dataset exists and, where its sidecar says, was made by the tokenizer given."""
    _, prefixes = parse_data_path(config.data.data_path)
    for prefix in prefixes:
        for suffix in (".idx", ".bin"):
            if not Path(prefix + suffix).is_file():
                raise ValueError(
                    f"{prefix}{suffix}: no such file; --data-path takes the prefix of a "
                    ".bin/.idx pair written by mds-tokenize"
                )
        check_dataset_tokenizer(prefix, vocab.record)


def _check_output_folders(config: TrainConfig) -> None:
    """A folder flag that names a file (or a path through one) fails before any work, with a
    line that says so; mkdir's own error, `File exists`, came only after DeepSpeed started."""
    for flag, path in (
        ("--save", config.checkpoint.save),
        ("--output-dir", config.logging.output_dir),
        ("--tensorboard-dir", config.logging.tensorboard_dir),
        ("--data-cache-path", config.data.data_cache_path),
    ):
        if path is None:
            continue
        path = Path(path)
        existing = next((p for p in (path, *path.parents) if p.exists()), None)
        if existing is None or existing.is_dir():
            continue
        if existing == path:
            raise ValueError(f"{path}: {flag} names a file, not a folder; give it a folder")
        raise ValueError(f"{existing}: a file, so {flag} {path} cannot be a folder in it")


def _loads_optimizer(config: TrainConfig) -> bool:
    return not (config.checkpoint.no_load_optim or config.checkpoint.finetune)


def _checkpoint_to_load(
    config: TrainConfig, topology: Topology, rank: int
) -> tuple[Path, dict] | None:
    """The --load checkpoint and its meta.json, one Megatron-DeepSpeed wrote converted first."""
    if config.checkpoint.load is None:
        if config.checkpoint.universal_checkpoint:
            raise ValueError("--universal-checkpoint reads the --load folder; give --load")
        return None
    if config.checkpoint.universal_checkpoint:
        if not _loads_optimizer(config):
            raise ValueError(
                "--universal-checkpoint loads the optimizer state with the weights; drop "
                "--no-load-optim / --finetune, or drop --universal-checkpoint and --load a "
                "checkpoint folder"
            )
        return find_universal_checkpoint(Path(config.checkpoint.load))
    save = config.checkpoint.save and Path(config.checkpoint.save)
    found = find_checkpoint(Path(config.checkpoint.load), save_dir=save)
    if found is None and config.checkpoint.exit_on_missing_checkpoint:
        raise ValueError(
            f"{config.checkpoint.load}: --load holds no checkpoint and "
            "--exit-on-missing-checkpoint is given; drop it to start from scratch"
        )
    if found is None or not needs_conversion(found[1]):
        return found
    if found[1] is None:
        as_is = loadable_as_is(
            found[0],
            tensor_model_parallel_size=topology.tensor_model_parallel_size,
            pipeline_model_parallel_size=topology.pipeline_model_parallel_size,
            data_parallel_size=topology.data_parallel_size,
            zero_stage=effective_zero_stage(config, topology),
            loads_optimizer=_loads_optimizer(config),
        )
        if as_is is not None:
            return found[0], as_is
    return convert_upstream(
        found[0],
        save_dir=save,
        tensor_model_parallel_size=topology.tensor_model_parallel_size,
        pipeline_model_parallel_size=topology.pipeline_model_parallel_size,
        with_optimizer=_loads_optimizer(config),
        rank=rank,
        barrier=dist.barrier,
    )


def run(
    config: TrainConfig, *, warnings: list[str] = (), given: frozenset[str] = frozenset()
) -> int:
    """`warnings`: notes for rank 0 to log (ignored flags); `given`: the config fields the user
    gave (cli.given_fields), which a `--deepspeed_config` file may not contradict."""
    # Flags, vocabulary and datasets are checked before DeepSpeed loads or any process group
    # forms, so a mistake is one line on stderr and nothing else; first of all, that the
    # installed DeepSpeed is one whose internals mds-train was checked against.
    check_deepspeed_version()
    launch = launch_environment()
    topology = config.topology(launch.world_size)
    user_ds: dict = {}
    if config.parallel.deepspeed_config is not None:
        path = config.parallel.deepspeed_config
        user_ds = load_user_config(path)
        config = resolve_user_config(config, user_ds, topology, given=given, source=str(path))
    config.validate(topology)
    _check_gpu_features(config)
    vocab = read_vocabulary(config.data)
    _check_datasets(config, vocab)
    _check_output_folders(config)
    backend, backend_note = choose_backend(
        config.parallel.distributed_backend,
        cuda=torch.cuda.is_available(),
        available=lambda name: getattr(dist, f"is_{name}_available")(),
    )
    config, user_ds, fp16_note = without_fp16(config, user_ds, fp16_supported=_fp16_supported())
    init_distributed(backend, timeout_minutes=config.parallel.distributed_timeout_minutes)
    save_note = None
    if config.checkpoint.save_interval is not None and config.checkpoint.save is None:
        # upstream saves at an interval only `if args.save` (finetune_llama.sh passes it alone)
        save_note = "--save-interval without --save: no checkpoint is saved"
    notes = [note for note in (*warnings, backend_note, fp16_note, save_note) if note]
    try:
        with _output_folders_locked(config, launch):
            return _run_joined(config, launch, topology, vocab, user_ds, notes)
    except _StoppedByRank0:
        return EXIT_FAILED
    except Exception as error:
        if launch.world_size > 1 and another_process_left(error):
            # The process that left said why (or the launcher says how it ended); this rank's
            # broken connection, as a traceback from every other rank, would only bury that.
            return EXIT_FAILED
        raise


def _check_gpu_features(config: TrainConfig) -> None:
    """--fp8-* and --enable-cuda-graph: refused in one line where the GPU they need is not (FP8:
    no FP8 tensor cores, a CPU or a pre-Ada GPU)."""
    recipe = config.precision.fp8_recipe()
    if recipe is not None:
        from mds_model.fp8.recipe import device_problem

        problem = device_problem()
        if problem is not None:
            raise ValueError(f"--fp8-{'e4m3' if recipe.fmt == 'e4m3' else 'hybrid'}: {problem}")
    if config.model.enable_cuda_graph and not torch.cuda.is_available():
        raise ValueError("--enable-cuda-graph: CUDA graphs need a GPU; there is none here")


def _run_joined(
    config: TrainConfig,
    launch: LaunchInfo,
    topology: Topology,
    vocab: Vocabulary,
    user_ds: dict,
    notes: list[str],
) -> int:
    """The run once every rank has joined the process group; `notes` are for rank 0 to log."""
    _configure_logging(launch.rank)
    if launch.rank == 0:  # the same on every rank: said once
        for note in notes:
            logger.warning("%s", note)
    if config.logging.peak_tflops is None:
        peak = default_peak_tflops(config.params_dtype)
        config = dataclasses.replace(
            config, logging=dataclasses.replace(config.logging, peak_tflops=peak)
        )
    logger.info(
        "mds-train %s: %d processes (%s), TP=%d PP=%d DP=%d, ZeRO-%d, %s",
        distribution_version("mds-train"),
        topology.world_size,
        launch.launcher,
        topology.tensor_model_parallel_size,
        topology.pipeline_model_parallel_size,
        topology.data_parallel_size,
        effective_zero_stage(config, topology),
        config.params_dtype,
    )
    gpt_config = config.model.gpt_config(
        vocab_size=vocab.size,
        tensor_model_parallel_size=topology.tensor_model_parallel_size,
        params_dtype=config.params_dtype,
        kernels_available=torch.cuda.is_available(),  # CPU runs take the pure-torch paths
    )
    found = _checkpoint_to_load(config, topology, launch.rank)
    if found is not None:
        gpt_config = with_checkpoint_padding(
            gpt_config,
            found[1],
            rows_given=config.model.pad_vocab_size_to is not None,
            tensor_model_parallel_size=topology.tensor_model_parallel_size,
        )
    description = run_description(config, topology, gpt_config, vocab)
    universal = found is not None and config.checkpoint.universal_checkpoint
    if universal:
        check_universal_compatible(
            found[1],
            description,
            found[0],
            tokenizer_change_allowed=config.checkpoint.allow_tokenizer_change,
        )
    elif found is not None:  # before the model is built: a mismatch fails at once
        check_compatible(
            found[1],
            description,
            path=found[0],
            loads_optimizer=_loads_optimizer(config),
            tokenizer_change_allowed=config.checkpoint.allow_tokenizer_change,
        )
        if launch.rank == 0:  # the others stop quietly when it does
            check_readable(found[0], found[1], loads_optimizer=_loads_optimizer(config))
    recorded = found[1].lr_schedule if found is not None else None
    lr_schedule, schedule_record = resolve_schedule(
        config, topology, recorded, source=str(found[0]) if found else ""
    )
    description = description.replace(lr_schedule=schedule_record)
    # Every rank creates it, before the model's groups: the exit checks' all-reduce (loop.py).
    exit_group = dist.new_group(backend="gloo") if launch.world_size > 1 else None
    setup = build_training_setup(config, topology, gpt_config, user_ds)
    checkpoint = CheckpointContext(
        engine=setup.engine,
        rank=launch.rank,
        world_size=launch.world_size,
        barrier=dist.barrier,
        rng_tracker=setup.rng_tracker,
        meta=description,
        groups=setup.groups,
        optimizer=setup.optimizer,
        fp8=setup.fp8,
        recorded_ds_config=recorded_deepspeed_config(config, topology, user_ds),
    )
    state = TrainingState()
    if universal:
        state = load_universal(
            checkpoint,
            found,
            deepspeed_loads=deepspeed_loads_universal(config, topology, user_ds),
            num_layers=gpt_config.num_layers,
        )
        scheduler_progress(state, recorded)
    elif found is not None:
        state = load_checkpoint(
            checkpoint,
            found,
            load_optimizer=not config.checkpoint.no_load_optim,
            load_rng=not config.checkpoint.no_load_rng,
            finetune=config.checkpoint.finetune,
        )
        if not config.checkpoint.finetune:
            scheduler_progress(state, recorded)
        remove_converted(found[0], rank=launch.rank, barrier=dist.barrier)
    graph_problem = config.cuda_graph_problem(topology) or deepspeed_optimizer_problem(
        config, topology, user_ds
    )
    if config.model.enable_cuda_graph and graph_problem is not None:
        raise ValueError(f"--enable-cuda-graph: {graph_problem}")
    if config.uses_cuda_graphs(topology, gpu=torch.cuda.is_available()) and graph_problem is None:
        # On the weights as loaded, before the first step.
        capture_layer_graphs(setup, micro_batch_size=config.batch.micro_batch_size)
    elif torch.cuda.is_available() and not config.model.no_cuda_graph and launch.rank == 0:
        logger.info("layers run eagerly, not as CUDA graphs: %s", graph_problem)
    train_iters = config.train_iters(topology)
    datasets = build_datasets(
        config, topology, train_iters=train_iters, rank=launch.rank, barrier=dist.barrier
    )
    output_dir = config.logging.output_dir or config.checkpoint.save
    if launch.rank == 0 and output_dir is not None:
        _write_resolved_config(Path(output_dir), config, description, setup.ds_config)
    metrics = MetricsWriter(
        output_dir=Path(output_dir) if launch.rank == 0 and output_dir else None,
        tensorboard_dir=config.logging.tensorboard_dir if launch.rank == 0 else None,
        queue_size=config.logging.tensorboard_queue_size,
    )
    trainer = Trainer(
        config=config,
        topology=topology,
        setup=setup,
        state=state,
        train_iters=train_iters,
        lr_schedule=lr_schedule,
        batch_schedule=config.batch_schedule(topology),
        datasets=datasets,
        checkpoint=checkpoint,
        metrics=metrics,
        rank=launch.rank,
        device=device(),
        eod_mask_id=vocab.eod_id if config.data.eod_mask_loss else None,
        exit_group=exit_group,
        profiler=StepProfiler(
            config.profiler,
            rank=launch.rank,
            tensorboard_dir=config.logging.tensorboard_dir,
            cuda=torch.cuda.is_available(),
        ),
    )
    try:
        code = trainer.train()
    finally:
        trainer.profiler.close()
        metrics.close()
    # Only after a run that ended alike on every rank: after a failure the others are elsewhere
    # (or gone), and a barrier would pair with whatever collective they are in.
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()
    return code


class _StoppedByRank0(Exception):
    """Rank 0 could not lock an output folder and says why; the other ranks exit 1 quietly."""


@contextmanager
def _output_folders_locked(config: TrainConfig, launch: LaunchInfo) -> Iterator[None]:
    """Rank 0 holds the lock of --save (and of --output-dir, where it is another folder) for the
    whole run, taken before anything is written there (a conversion of upstream's files,
    config.json, metrics.jsonl, checkpoints): a second run on the folder is refused before it
    trains, naming the one that holds it. Every rank learns the outcome from one broadcast."""
    locks, failure = [], None
    if launch.rank == 0:
        try:
            locks = _lock_output_folders(config)
        except (OSError, ValueError) as error:
            failure = error
    if launch.world_size > 1:
        failed = [failure is not None]
        dist.broadcast_object_list(failed, src=0)
        if failed[0]:
            # Every rank leaves the group before exiting: one that exited in it while another
            # was still there sometimes aborted (`terminate called without an active exception`).
            dist.barrier()
            dist.destroy_process_group()
            if launch.rank != 0:
                raise _StoppedByRank0
    if failure is not None:
        raise failure
    try:
        yield
    finally:
        for lock in reversed(locks):
            lock.release()


def _lock_output_folders(config: TrainConfig) -> list[FolderLock]:
    folders: dict[Path, tuple[str, Path]] = {}
    for flag, path in (
        ("--save", config.checkpoint.save),
        ("--output-dir", config.logging.output_dir),
    ):
        if path is not None:
            folders.setdefault(Path(path).resolve(), (flag, Path(path)))
    command = shlex.join(["mds-train", *sys.argv[1:]])
    locks: list[FolderLock] = []
    try:
        for flag, path in folders.values():
            lock = FolderLock(path, name=FOLDER_LOCK, command=command)
            try:
                lock.acquire()
            except FolderInUse as busy:
                raise ValueError(
                    f"{path}: {flag} folder is in use by another run ({busy.holder}); wait for "
                    f"it to end or give {flag} another folder"
                ) from None
            locks.append(lock)
    except BaseException:
        for lock in reversed(locks):
            lock.release()
        raise
    return locks


def _fp16_supported() -> bool:
    if torch.cuda.is_available():
        return True
    from deepspeed.accelerator import get_accelerator

    return bool(get_accelerator().is_fp16_supported())


def _write_resolved_config(
    output_dir: Path, config: TrainConfig, description: CheckpointMeta, ds_config: dict
) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    written = description.to_json()
    resolved = {
        **{key: written[key] for key in ("tool", "version", "versions", "parallel")},
        "config": config.to_dict(),
        "deepspeed_config": ds_config,
        "argv": sys.argv,
    }
    write_text_atomically(output_dir / "config.json", json.dumps(resolved, indent=2, default=str))
