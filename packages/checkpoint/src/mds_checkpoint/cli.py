"""`mds-merge-mp`: reshape (the default command), `export-hf`, `import-hf`.

Megatron's `tools/merge_mp_partitions.py` line works unchanged (`--model-type GPT`,
`--tensor-model-parallel-size` / `--pipeline-model-parallel-size` naming the source's layout and
the model flags, all checked against the checkpoint; `--target-pipeline-model-parallel-size`);
its tokenizer flags and any training flags are accepted with a note (mds_common.ignored_flags).
Parsing, errors and exit codes follow the shared dialect (`mds_common.cli`, docs/cli.md); torch
and the readers load inside the commands, so `--help` stays fast.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer
from mds_common.cli import new_app, run_app, run_then_exit
from mds_common.flags import command_function, group_from_values
from mds_common.ignored_flags import TRAINING_FLAGS, IgnoredFlags, ignored

from .config import ExportConfig, ImportConfig, ReshapeConfig, SourceChecks

app = new_app(
    "Reshape mds-train / Megatron(-DeepSpeed) checkpoints to any TP/PP (merge, the default), "
    "with optimizer state; export to and import from Hugging Face (GPT-2, Llama, GPT-NeoX, BLOOM)."
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


def _merge(**values: Any) -> None:
    checks = group_from_values(SourceChecks, values)
    config = group_from_values(ReshapeConfig, values)
    with _loading():
        from .reshape import reshape

    layout = (checks.tensor_model_parallel_size, checks.pipeline_model_parallel_size)
    if checks.given_model() or layout != (None, None):
        _check_source(config, checks)
    result = reshape(config)
    typer.echo(
        f"wrote {result.folder}: TP={config.target_tensor_model_parallel_size} "
        f"PP={config.target_pipeline_model_parallel_size}, "
        f"{result.num_tensors} tensors ({result.num_bytes / 2**20:.1f} MiB) in "
        f"{result.seconds:.1f} s" + (" with optimizer state" if config.with_optimizer else "")
    )
    if result.verification is not None:
        typer.echo(f"verify: {result.verification.summary()}")


def _check_source(config: ReshapeConfig, checks: SourceChecks) -> None:
    """The source-describing flags of merge_mp_partitions' line against the checkpoint."""
    from .describe import check_model_flags
    from .source import open_source

    source = open_source(config.load, iteration=config.iteration)
    for flag, given, saved, name in (
        (
            "--tensor-model-parallel-size",
            checks.tensor_model_parallel_size,
            source.tensor_model_parallel_size,
            "TP",
        ),
        (
            "--pipeline-model-parallel-size",
            checks.pipeline_model_parallel_size,
            source.pipeline_model_parallel_size,
            "PP",
        ),
    ):
        if given is not None and given != saved:
            raise ValueError(f"{flag} {given}: the checkpoint was saved with {name}={saved}")
    check_model_flags(source.config, checks.given_model())


def _export_hf(**values: Any) -> None:
    config = group_from_values(ExportConfig, values)
    with _loading():
        from .hf import export_hf

    result = export_hf(config)
    typer.echo(f"wrote {result.folder}: {result.architecture}, {result.num_tensors} tensors")
    if result.verification is not None:
        typer.echo(f"verify: {result.verification.summary()}")


def _import_hf(**values: Any) -> None:
    config = group_from_values(ImportConfig, values)
    config.tokenizer()  # a misplaced tokenizer flag: the usage error first (exit 2)
    with _loading():
        from .hf import import_hf

    folder = import_hf(config)
    typer.echo(
        f"wrote {folder}: TP={config.target_tensor_model_parallel_size} "
        f"PP={config.target_pipeline_model_parallel_size}"
    )


app.command("merge")(
    MERGE_IGNORED.accepting(
        command_function(
            _merge,
            [ReshapeConfig, SourceChecks],
            name="merge",
            doc="Reshape a checkpoint to another tensor/pipeline-parallel layout (mds-train's "
            "layout).",
        )
    )
)
app.command("export-hf")(
    command_function(
        _export_hf,
        [ExportConfig],
        name="export_hf",
        doc="Write a Hugging Face folder (config.json + model.safetensors, padding removed): "
        "GPT2LMHeadModel, LlamaForCausalLM, GPTNeoXForCausalLM or BloomForCausalLM, as the "
        "model is.",
    )
)
app.command("import-hf")(
    command_function(
        _import_hf,
        [ImportConfig],
        name="import_hf",
        doc="Turn a Hugging Face GPT-2, Llama, GPT-NeoX or BLOOM folder into an mds-train "
        "checkpoint at any TP/PP.",
    )
)


def main(argv: list[str] | None = None) -> None:
    run_app(
        app, prog="mds-merge-mp", distribution="mds-checkpoint", argv=argv, default_command="merge"
    )


def script() -> None:
    """The `mds-merge-mp` command (and `python -m mds_checkpoint`): `main()`, then the process
    ends without tearing the interpreter down (mds_common.cli.run_then_exit: 10-15% of a 345M
    reshape's whole run on a small VM)."""
    # A CPU tool: DeepSpeed (whose files are read) then skips its accelerator probe and warning.
    # Set for the command's own process only: in-process callers' later children (a GPU training
    # run started by the same test) would inherit a CPU accelerator.
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    run_then_exit(main)


if __name__ == "__main__":
    script()
