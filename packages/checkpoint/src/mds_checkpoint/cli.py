"""`mds-merge-mp`: reshape (the default command), `export-hf`, `import-hf`.

Megatron's `tools/merge_mp_partitions.py` line works unchanged (`--model-type GPT`,
`--tensor-model-parallel-size` / `--pipeline-model-parallel-size` naming the source's layout and
the model flags, all checked against the checkpoint; `--target-pipeline-model-parallel-size`);
its tokenizer flags and any training flags are accepted with a note (mds_common.ignored_flags).
Parsing, errors and exit codes follow the shared dialect (`mds_common.cli`, docs/cli.md); torch
and the readers load inside the commands, so `--help` stays fast.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from mds_common.cli import new_app, run_app
from mds_common.ignored_flags import TRAINING_FLAGS, IgnoredFlags, ignored

app = new_app(
    "Reshape mds-train / Megatron(-DeepSpeed) checkpoints to any TP/PP (merge, the default), "
    "with optimizer state; export to and import from Hugging Face GPT-2."
)

Load = Annotated[
    Path, typer.Option("--load", help="Save folder (with `latest`) or one checkpoint folder.")
]
Save = Annotated[Path, typer.Option("--save", help="Output folder (created; must not exist).")]
TargetTP = Annotated[
    int,
    typer.Option("--target-tensor-model-parallel-size", help="Tensor-parallel size of the output."),
]
TargetPP = Annotated[
    int,
    typer.Option(
        "--target-pipeline-model-parallel-size",
        help="Pipeline stages of the output (must divide --num-layers).",
    ),
]
Iteration = Annotated[
    int | None,
    typer.Option("--iteration", help="Read global_stepN / iter_N instead of the newest."),
]
# merge_mp_partitions' model flags: the checkpoint says its shape, a flag given must repeat it.
ModelFlag = Annotated[int | None, typer.Option(help="Checked against the checkpoint, if given.")]
MODEL_FLAGS = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "seq_length",
    "max_position_embeddings",
)
_TOKENIZER = "the checkpoint's tokenizer record is carried over"
# What merge_mp_partitions' and the training scripts' lines also pass (issue #21: the README's
# line works unchanged): accepted, each one given noted once.
MERGE_IGNORED = (
    IgnoredFlags(
        [
            ignored("--tokenizer-type", why=_TOKENIZER),
            ignored("--vocab-file", why=_TOKENIZER),
            ignored("--merge-file", why=_TOKENIZER),
            ignored("--tokenizer-name-or-path", why=_TOKENIZER),
            ignored("--eod-token", why=_TOKENIZER),
            ignored("--make-vocab-size-divisible-by", why="the checkpoint holds the padded rows"),
        ]
    )
    + TRAINING_FLAGS
)


@contextmanager
def _loading() -> Iterator[None]:
    """The commands' imports (torch's thousands of modules) with the garbage collector off: it
    would run several full collections over them, 0.2 s of the start-up on a small VM, and
    imports make no garbage cycles worth collecting."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@app.command("merge")
@MERGE_IGNORED.accepting
def merge(
    load: Load,
    save: Save,
    target_tensor_model_parallel_size: TargetTP = 1,
    target_pipeline_model_parallel_size: TargetPP = 1,
    iteration: Iteration = None,
    with_optimizer: Annotated[
        bool,
        typer.Option(
            "--with-optimizer",
            help="Also reshape fp32 master weights and Adam moments (any DP size) so that "
            "mds-train --load resumes at the new layout.",
        ),
    ] = False,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify",
            help="Run source and output on a fixed batch on CPU; print the largest "
            "logit difference and the loss on that batch.",
        ),
    ] = False,
    tensor_model_parallel_size: Annotated[
        int | None,
        typer.Option(
            "--tensor-model-parallel-size",
            help="The source's TP size (merge_mp_partitions' flag); checked against the files.",
        ),
    ] = None,
    pipeline_model_parallel_size: Annotated[
        int | None,
        typer.Option(
            "--pipeline-model-parallel-size",
            help="The source's PP size (merge_mp_partitions' flag); checked against the files.",
        ),
    ] = None,
    model_type: Annotated[
        str, typer.Option("--model-type", help="merge_mp_partitions' flag; only GPT.")
    ] = "GPT",
    num_layers: ModelFlag = None,
    hidden_size: ModelFlag = None,
    num_attention_heads: ModelFlag = None,
    seq_length: ModelFlag = None,
    max_position_embeddings: ModelFlag = None,
    target_layout: Annotated[
        str,
        typer.Option(
            "--target-layout",
            help="Files to write: mds (mds-train's), deepspeedai or bigscience "
            "(Megatron-DeepSpeed forks' DeepSpeed files), megatron (iter_N/mp_rank_XX/"
            "model_optim_rng.pt).",
        ),
    ] = "mds",
) -> None:
    """Reshape a checkpoint to another tensor/pipeline-parallel layout (mds-train's layout)."""
    with _loading():
        from .config import ReshapeConfig
        from .reshape import reshape

    if model_type.upper() != "GPT":
        raise ValueError(f"--model-type {model_type}: only GPT checkpoints are reshaped")
    config = ReshapeConfig(
        load=load,
        save=save,
        tensor_parallel=target_tensor_model_parallel_size,
        pipeline_parallel=target_pipeline_model_parallel_size,
        iteration=iteration,
        with_optimizer=with_optimizer,
        verify=verify,
        layout=target_layout,
    )
    model_flags = tuple(
        (name, value)
        for name, value in zip(
            MODEL_FLAGS,
            (num_layers, hidden_size, num_attention_heads, seq_length, max_position_embeddings),
            strict=True,
        )
        if value is not None
    )
    layout = (tensor_model_parallel_size, pipeline_model_parallel_size)
    if model_flags or layout != (None, None):
        _check_source(config, *layout, model_flags)
    result = reshape(config)
    typer.echo(
        f"wrote {result.folder}: TP={config.tensor_parallel} PP={config.pipeline_parallel}, "
        f"{result.num_tensors} tensors ({result.num_bytes / 2**20:.1f} MiB) in "
        f"{result.seconds:.1f} s" + (" with optimizer state" if with_optimizer else "")
    )
    if result.verification is not None:
        typer.echo(f"verify: {result.verification.summary()}")


def _check_source(config, tp: int | None, pp: int | None, model_flags: tuple) -> None:
    """The source-describing flags of merge_mp_partitions' line against the checkpoint."""
    from .describe import check_model_flags
    from .source import open_source

    source = open_source(config.load, iteration=config.iteration)
    for flag, given, saved, name in (
        ("--tensor-model-parallel-size", tp, source.tp_size, "TP"),
        ("--pipeline-model-parallel-size", pp, source.pp_size, "PP"),
    ):
        if given is not None and given != saved:
            raise ValueError(f"{flag} {given}: the checkpoint was saved with {name}={saved}")
    check_model_flags(source.config, model_flags)


@app.command("export-hf")
def export_hf(
    load: Load,
    save: Annotated[Path, typer.Option("--save", help="Hugging Face folder to write.")],
    iteration: Iteration = None,
    eos_token_id: Annotated[
        int | None,
        typer.Option("--eos-token-id", help="BOS/EOS id; default: the checkpoint tokenizer's."),
    ] = None,
    verify: Annotated[
        bool,
        typer.Option("--verify", help="Compare the exported weights' logits with the source's."),
    ] = False,
    vocab_file: Annotated[
        Path | None,
        typer.Option("--vocab-file", help="GPT-2 vocab.json to put beside; default: the ckpt's."),
    ] = None,
    merge_file: Annotated[
        Path | None,
        typer.Option("--merge-file", help="GPT-2 merges.txt to put beside (with --vocab-file)."),
    ] = None,
) -> None:
    """Write a GPT2LMHeadModel folder (config.json + model.safetensors, padding removed)."""
    with _loading():
        from .config import ExportConfig
        from .hf import export_hf as run_export

    result = run_export(
        ExportConfig(
            load=load,
            save=save,
            iteration=iteration,
            eos_token_id=eos_token_id,
            verify=verify,
            vocab_file=vocab_file,
            merge_file=merge_file,
        )
    )
    typer.echo(f"wrote {result.folder}: GPT2LMHeadModel, {result.num_tensors} tensors")
    if result.verification is not None:
        typer.echo(f"verify: {result.verification.summary()}")


@app.command("import-hf")
def import_hf(
    load: Annotated[
        Path, typer.Option("--load", help="Hugging Face GPT-2 folder (config.json, safetensors).")
    ],
    save: Save,
    target_tensor_model_parallel_size: TargetTP = 1,
    target_pipeline_model_parallel_size: TargetPP = 1,
    make_vocab_size_divisible_by: Annotated[
        int, typer.Option("--make-vocab-size-divisible-by", help="Vocab padding multiple (x TP).")
    ] = 128,
    seq_length: Annotated[
        int | None, typer.Option("--seq-length", help="Training length; default n_positions.")
    ] = None,
) -> None:
    """Turn a Hugging Face GPT-2 folder into an mds-train checkpoint at any TP/PP."""
    with _loading():
        from .config import ImportConfig
        from .hf import import_hf as run_import

    folder = run_import(
        ImportConfig(
            load=load,
            save=save,
            tensor_parallel=target_tensor_model_parallel_size,
            pipeline_parallel=target_pipeline_model_parallel_size,
            make_vocab_size_divisible_by=make_vocab_size_divisible_by,
            seq_length=seq_length,
        )
    )
    typer.echo(
        f"wrote {folder}: TP={target_tensor_model_parallel_size} "
        f"PP={target_pipeline_model_parallel_size}"
    )


def main(argv: list[str] | None = None) -> None:
    run_app(
        app, prog="mds-merge-mp", distribution="mds-checkpoint", argv=argv, default_command="merge"
    )


def script() -> None:
    """The `mds-merge-mp` command (and `python -m mds_checkpoint`): `main()`, then the process
    ends without tearing the interpreter down.

    Tearing down an interpreter that imported torch (clearing thousands of modules, collecting
    their objects) takes 0.5-0.8 s on a small VM, 10-15% of a 345M reshape's whole run, and
    does nothing a finished command needs: every output file is written, fsynced and renamed
    inside `main()`. The exit functions still run (logging's flush, thread pools' joins) and the
    standard streams are flushed. In-process callers (tests) use `main()`, which returns or
    raises as usual."""
    # A CPU tool: DeepSpeed (whose files are read) then skips its accelerator probe and warning.
    # Set for the command's own process only: in-process callers' later children (a GPU training
    # run started by the same test) would inherit a CPU accelerator.
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        main()
    except SystemExit as exit_:
        if exit_.code is not None and not isinstance(exit_.code, int):
            raise  # a message to print: the interpreter's own exit does that
        code = exit_.code or 0
    else:
        code = 0
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe, as at a normal exit
            pass
    os._exit(code)


if __name__ == "__main__":
    script()
