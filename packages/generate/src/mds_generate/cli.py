"""`mds-generate` command line: `sample` (the default command) and `eval`.

Megatron's `tools/generate_samples_gpt.py` and `tasks/main.py` command lines work as written: the
model flags they need (`--num-layers`, `--hidden-size`, ...) are accepted and checked against the
checkpoint, which says its own shape; the training flags a script's `$GPT_ARGS` also holds are
accepted with a note each (mds_common.ignored_flags). Parsing, errors and exit codes follow the
shared dialect (`mds_common.cli`, docs/cli.md); torch is imported inside the commands.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mds_common.cli import new_app, run_app, run_then_exit
from mds_common.flags import command_function, flag, group_from_values
from mds_common.ignored_flags import TRAINING_FLAGS, IgnoredFlags, ignored

from .config import (
    EvalConfig,
    GenerationConfig,
    SampleConfig,
    SamplingConfig,
    SourceFlags,
)

app = new_app(
    "Sample text from an mds or Megatron-DeepSpeed checkpoint or a Hugging Face GPT-2, Llama, "
    "GPT-NeoX or BLOOM folder, or evaluate it zero-shot (WikiText-103 perplexity, LAMBADA "
    "accuracy)."
)

_WHOLE = "the checkpoint is read whole, whatever its layout"
# The rest of a training script's $GPT_ARGS (issue #21: 004's generate_samples_gpt.py line passes
# the pretraining flags): accepted, each one given noted once.
GENERATE_IGNORED = (
    IgnoredFlags(
        [
            ignored("--tensor-model-parallel-size", why=_WHOLE),
            ignored("--pipeline-model-parallel-size", why=_WHOLE),
            ignored("--make-vocab-size-divisible-by", why="the checkpoint holds the padded rows"),
        ]
    )
    + TRAINING_FLAGS
)


@dataclass(frozen=True, kw_only=True)
class CudaGraphs:
    no_cuda_graphs: bool = flag(
        "--no-cuda-graphs", default=False, help="Launch every kernel of every step (debugging)."
    )


def _sample(**values: Any) -> None:
    from .modes import run_sample

    source = group_from_values(SourceFlags, values).model_source(
        cuda_graphs=not group_from_values(CudaGraphs, values).no_cuda_graphs
    )
    prompt, input_file = values["prompt"], values["sample_input_file"]
    modes = [
        name
        for name, given in (
            ("prompt", prompt is not None),
            ("input-file", input_file is not None),
            ("unconditional", values["num_samples"] > 0 or values["genfile"] is not None),
        )
        if given
    ]
    if len(modes) > 1:
        raise ValueError("give one of --prompt, --sample-input-file, --num-samples/--genfile")
    if input_file is not None and not input_file.is_file():
        raise ValueError(f"--sample-input-file {input_file}: no such file")
    config = group_from_values(
        SampleConfig,
        values,
        source=source,
        sampling=group_from_values(SamplingConfig, values),
        generation=group_from_values(GenerationConfig, values),
        mode=modes[0] if modes else "interactive",
    )
    run_sample(config)


def _evaluate(**values: Any) -> None:
    from .evaluation import run_eval

    source = group_from_values(SourceFlags, values).model_source()
    run_eval(group_from_values(EvalConfig, values, source=source))


def _command(body, groups, *, name: str, doc: str):
    return GENERATE_IGNORED.accepting(command_function(body, groups, name=name, doc=doc))


app.command("sample")(
    _command(
        _sample,
        [SourceFlags, SampleConfig, SamplingConfig, GenerationConfig, CudaGraphs],
        name="sample",
        doc="Sample: one --prompt, every line of --sample-input-file, --num-samples "
        "unconditional samples into --genfile, or (none of those) prompts read from stdin, "
        "streamed.",
    )
)
app.command("eval")(
    _command(
        _evaluate,
        [SourceFlags, EvalConfig],
        name="evaluate",
        doc="Zero-shot evaluation as Megatron's tasks/main.py: WikiText-103 perplexity "
        "(overlapping windows, word-level adjusted) or LAMBADA last-word accuracy.",
    )
)


def main(argv: list[str] | None = None) -> None:
    run_app(
        app, prog="mds-generate", distribution="mds-generate", argv=argv, default_command="sample"
    )


def script() -> None:
    """The `mds-generate` command (and `python -m mds_generate`): `main()`, then the process
    ends without tearing the interpreter down (mds_common.cli.run_then_exit: torch's modules are
    not cleared one by one after the command's output is written)."""
    run_then_exit(main)


if __name__ == "__main__":
    script()
