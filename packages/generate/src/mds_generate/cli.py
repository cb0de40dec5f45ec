"""`mds-generate` command line: `sample` (the default command) and `eval`.

Megatron's `tools/generate_samples_gpt.py` and `tasks/main.py` command lines work as written: the
model flags they need (`--num-layers`, `--hidden-size`, ...) are accepted and checked against the
checkpoint, which says its own shape; the training flags a script's `$GPT_ARGS` also holds are
accepted with a note each (mds_common.ignored_flags). Parsing, errors and exit codes follow the
shared dialect (`mds_common.cli`, docs/cli.md); torch is imported inside the commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from mds_common.cli import new_app, run_app
from mds_common.ignored_flags import TRAINING_FLAGS, IgnoredFlags, ignored
from mds_tokenize.flags import EodToken, MergeFile, TokenizerNameOrPath, VocabFile

app = new_app(
    "Sample text from an mds checkpoint or a Hugging Face GPT-2 folder, or evaluate it zero-shot "
    "(WikiText-103 perplexity, LAMBADA accuracy)."
)

Load = Annotated[
    Path,
    typer.Option(
        help="An mds checkpoint (save folder with `latest`, or one global_stepN) of any TP/PP "
        "layout, or a Hugging Face GPT-2 folder."
    ),
]
Iteration = Annotated[
    int | None, typer.Option(help="Load global_stepN of the save folder instead of `latest`.")
]
# The tokenizer flags of every mds tool (mds_tokenize.flags); all default to the checkpoint's.
TokenizerType = Annotated[
    str | None,
    typer.Option(
        "--tokenizer-type",
        help="GPT2BPETokenizer (--vocab-file, --merge-file) or PretrainedFromHF "
        "(--tokenizer-name-or-path) [default: the checkpoint's tokenizer].",
    ),
]
Device = Annotated[str, typer.Option(help="cpu, cuda, cuda:N or auto (cuda when available).")]
Dtype = Annotated[
    str,
    typer.Option(
        help="auto (float32 on CPU, the checkpoint's half precision on a GPU), "
        "float32, bfloat16 or float16."
    ),
]
Bf16 = Annotated[bool, typer.Option("--bf16", help="Megatron's flag: --dtype bfloat16.")]
Fp16 = Annotated[bool, typer.Option("--fp16", help="Megatron's flag: --dtype float16.")]
NoCudaGraphs = Annotated[
    bool, typer.Option("--no-cuda-graphs", help="Launch every kernel of every step (debugging).")
]
SeqLength = Annotated[
    int | None, typer.Option(help="Context window; default: the model's. Must not exceed it.")
]
MicroBatch = Annotated[
    int, typer.Option("--micro-batch-size", "--batch-size", help="Rows run together.")
]
# Megatron model flags: accepted so old command lines run, and checked against the checkpoint.
ModelFlag = Annotated[int | None, typer.Option(help="Checked against the checkpoint, if given.")]
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


SHAPE_FLAGS = ("num_layers", "hidden_size", "num_attention_heads", "max_position_embeddings")


def tokenizer_flags(flags: dict):
    """The tokenizer the flags name, or None when they name no files (then the checkpoint's is
    used, and a lone --tokenizer-type is checked against it); a misplaced flag exits 2."""
    from mds_tokenize.flags import tokenizer_spec
    from mds_tokenize.interface import GPT2_BPE, PRETRAINED_FROM_HF

    named = ("vocab_file", "merge_file", "tokenizer_name_or_path", "eod_token")
    kind = flags["tokenizer_type"]
    if all(flags[name] is None for name in named):
        if kind not in (None, GPT2_BPE, PRETRAINED_FROM_HF):
            tokenizer_spec(kind, None, None, None, None)  # the usage error naming the types
        return None
    if kind is None:
        kind = GPT2_BPE if flags["tokenizer_name_or_path"] is None else PRETRAINED_FROM_HF
    return tokenizer_spec(kind, *(flags[name] for name in named))


def model_source(flags: dict):
    """The `--load` group of a command's flags (its parameters by name) as a ModelSource."""
    from .config import ModelSource

    dtype, bf16, fp16 = flags["dtype"], flags["bf16"], flags["fp16"]
    if bf16 and fp16:
        raise ValueError("--bf16 and --fp16 exclude each other")
    if bf16 or fp16:
        if dtype not in ("auto", "bfloat16" if bf16 else "float16"):
            raise ValueError(f"--{'bf16' if bf16 else 'fp16'} contradicts --dtype {dtype}")
        dtype = "bfloat16" if bf16 else "float16"
    return ModelSource(
        load=flags["load"],
        iteration=flags["iteration"],
        tokenizer=tokenizer_flags(flags),
        tokenizer_type=flags["tokenizer_type"],
        device=flags["device"],
        dtype=dtype,
        cuda_graphs=not flags.get("no_cuda_graphs", False),
        expected_shape=tuple(
            (name, flags[name]) for name in SHAPE_FLAGS if flags[name] is not None
        ),
    )


@app.command()
@GENERATE_IGNORED.accepting
def sample(
    load: Load,
    prompt: Annotated[str | None, typer.Option(help="One prompt; the completion streams.")] = None,
    sample_input_file: Annotated[
        Path | None, typer.Option(help="One prompt per line, every line (JSON lines out).")
    ] = None,
    sample_output_file: Annotated[
        Path | None, typer.Option(help="JSON lines out; default: {sample-input-file}.out.")
    ] = None,
    num_samples: Annotated[
        int, typer.Option(help="Unconditional samples to write to --genfile (0: off).")
    ] = 0,
    genfile: Annotated[Path | None, typer.Option(help="Unconditional samples, JSON lines.")] = None,
    max_new_tokens: Annotated[
        int, typer.Option("--max-new-tokens", "--out-seq-length", help="New tokens at most.")
    ] = 1024,
    greedy: Annotated[bool, typer.Option("--greedy", help="Argmax instead of sampling.")] = False,
    temperature: Annotated[float, typer.Option(help="Logits are divided by it.")] = 1.0,
    top_k: Annotated[int, typer.Option(help="Keep the k most likely tokens (0: off).")] = 0,
    top_p: Annotated[
        float, typer.Option(help="Nucleus: smallest set reaching probability p (0: off).")
    ] = 0.0,
    repetition_penalty: Annotated[
        float, typer.Option(help="CTRL's penalty on tokens already seen (1: off).")
    ] = 1.0,
    frequency_penalty: Annotated[
        float, typer.Option(help="Subtracted per earlier occurrence in the completion (0: off).")
    ] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed of the draws: same seed, same samples.")] = 1234,
    stop: Annotated[
        list[str] | None, typer.Option(help="End a completion at any of these strings.")
    ] = None,
    ignore_eod: Annotated[
        bool, typer.Option("--ignore-eod", help="Do not stop at end-of-document.")
    ] = False,
    recompute: Annotated[
        bool, typer.Option("--recompute", help="No KV cache: full forward each step (check).")
    ] = False,
    micro_batch_size: MicroBatch = 8,
    log_interval: Annotated[int, typer.Option(help="Batches between timing lines.")] = 100,
    iteration: Iteration = None,
    tokenizer_type: TokenizerType = None,
    vocab_file: VocabFile = None,
    merge_file: MergeFile = None,
    tokenizer_name_or_path: TokenizerNameOrPath = None,
    eod_token: EodToken = None,
    device: Device = "auto",
    dtype: Dtype = "auto",
    bf16: Bf16 = False,
    fp16: Fp16 = False,
    no_cuda_graphs: NoCudaGraphs = False,
    seq_length: SeqLength = None,
    num_layers: ModelFlag = None,
    hidden_size: ModelFlag = None,
    num_attention_heads: ModelFlag = None,
    max_position_embeddings: ModelFlag = None,
) -> None:
    """Sample: one --prompt, every line of --sample-input-file, --num-samples unconditional
    samples into --genfile, or (none of those) prompts read from stdin, streamed."""
    source = model_source(locals())
    from .config import GenerationConfig, SampleConfig, SamplingConfig
    from .modes import run_sample

    modes = [
        name
        for name, given in (
            ("prompt", prompt is not None),
            ("input-file", sample_input_file is not None),
            ("unconditional", num_samples > 0 or genfile is not None),
        )
        if given
    ]
    if len(modes) > 1:
        raise ValueError("give one of --prompt, --sample-input-file, --num-samples/--genfile")
    if sample_input_file is not None and not sample_input_file.is_file():
        raise ValueError(f"--sample-input-file {sample_input_file}: no such file")
    config = SampleConfig(
        source=source,
        sampling=SamplingConfig(
            greedy=greedy,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            repetition_penalty=repetition_penalty,
            frequency_penalty=frequency_penalty,
            seed=seed,
        ),
        generation=GenerationConfig(
            max_new_tokens=max_new_tokens,
            stop=tuple(stop or ()),
            stop_at_eod=not ignore_eod,
            recompute=recompute,
            context_length=seq_length,
        ),
        mode=modes[0] if modes else "interactive",
        prompt=prompt,
        sample_input_file=sample_input_file,
        sample_output_file=sample_output_file,
        num_samples=num_samples,
        genfile=genfile,
        micro_batch_size=micro_batch_size,
        log_interval=log_interval,
    )
    run_sample(config)


@app.command("eval")
@GENERATE_IGNORED.accepting
def evaluate(
    load: Load,
    task: Annotated[str, typer.Option(help="WIKITEXT103 or LAMBADA (any case).")],
    valid_data: Annotated[
        list[Path],
        typer.Option(help="WikiText-103 test file (word level), or LAMBADA jsonl ('text')."),
    ],
    seq_length: SeqLength = None,
    overlapping_eval: Annotated[
        int, typer.Option(help="WikiText windows start every N tokens; each scores its last N.")
    ] = 32,
    strict_lambada: Annotated[
        bool, typer.Option("--strict-lambada", help="Score the whole last word (papers' figure).")
    ] = False,
    micro_batch_size: MicroBatch = 8,
    log_interval: Annotated[int, typer.Option(help="Batches between progress lines.")] = 10,
    iteration: Iteration = None,
    tokenizer_type: TokenizerType = None,
    vocab_file: VocabFile = None,
    merge_file: MergeFile = None,
    tokenizer_name_or_path: TokenizerNameOrPath = None,
    eod_token: EodToken = None,
    device: Device = "auto",
    dtype: Dtype = "auto",
    bf16: Bf16 = False,
    fp16: Fp16 = False,
    num_layers: ModelFlag = None,
    hidden_size: ModelFlag = None,
    num_attention_heads: ModelFlag = None,
    max_position_embeddings: ModelFlag = None,
) -> None:
    """Zero-shot evaluation as Megatron's tasks/main.py: WikiText-103 perplexity (overlapping
    windows, word-level adjusted) or LAMBADA last-word accuracy."""
    source = model_source(locals())
    from .config import EvalConfig
    from .evaluation import run_eval

    if len(valid_data) != 1:
        raise ValueError(f"--valid-data takes exactly one file, got {len(valid_data)}")
    run_eval(
        EvalConfig(
            source=source,
            task=task.lower(),
            valid_data=valid_data[0],
            seq_length=seq_length,
            overlapping_eval=overlapping_eval,
            strict_lambada=strict_lambada,
            micro_batch_size=micro_batch_size,
            log_interval=log_interval,
        )
    )


def main(argv: list[str] | None = None) -> None:
    run_app(
        app, prog="mds-generate", distribution="mds-generate", argv=argv, default_command="sample"
    )


if __name__ == "__main__":
    main()
