"""`mds-model` command line: `info` prints parameters, FLOPs per token and per-GPU memory.

Parsing, errors and exit codes follow the shared dialect (`mds_common.cli`, docs/cli.md); the model
code (and torch) is imported inside the command, so `--help` and `--version` stay fast.
"""

from __future__ import annotations

import json
import re
from typing import Annotated

import typer
from mds_common.cli import new_app, run_app

app = new_app("GPT model library of mds: size and memory planning.")


@app.callback()
def _root() -> None:
    """Keeps `info` a subcommand even while it is the only one."""


@app.command()
def info(
    num_layers: Annotated[int, typer.Option(help="Transformer layers (Megatron --num-layers).")],
    hidden_size: Annotated[int, typer.Option(help="Hidden size h (Megatron --hidden-size).")],
    num_attention_heads: Annotated[
        int, typer.Option(help="Attention heads; 0 means hidden_size / 64.")
    ] = 0,
    ffn_hidden_size: Annotated[
        int, typer.Option(help="MLP inner size; 0 means 4 * hidden_size.")
    ] = 0,
    seq_length: Annotated[int, typer.Option(help="Sequence length s.")] = 1024,
    max_position_embeddings: Annotated[
        int, typer.Option(help="Learned positions; 0 means seq_length.")
    ] = 0,
    vocab_size: Annotated[
        int, typer.Option(help="Tokenizer vocabulary size before padding.")
    ] = 50257,
    make_vocab_size_divisible_by: Annotated[
        int, typer.Option(help="Vocab padding multiple (times TP).")
    ] = 128,
    position_embedding_type: Annotated[
        str, typer.Option(help="learned, rotary or alibi.")
    ] = "learned",
    tensor_model_parallel_size: Annotated[int, typer.Option(help="Tensor-parallel size t.")] = 1,
    pipeline_model_parallel_size: Annotated[int, typer.Option(help="Pipeline stages.")] = 1,
    data_parallel_size: Annotated[
        int, typer.Option(help="Data-parallel replicas (for ZeRO sharding).")
    ] = 1,
    micro_batch_size: Annotated[int, typer.Option(help="Sequences per micro-batch per GPU.")] = 1,
    zero_stage: Annotated[int, typer.Option(help="DeepSpeed ZeRO stage 0-3.")] = 0,
    params_dtype: Annotated[str, typer.Option(help="float32, bfloat16 or float16.")] = "bfloat16",
    activation_checkpointing: Annotated[
        str, typer.Option(help="none, full or selective.")
    ] = "none",
    sequence_parallel: Annotated[
        bool,
        typer.Option(
            "--sequence-parallel", help="Split LayerNorm/dropout activations over TP ranks."
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
) -> None:
    """Parameters, model FLOPs per token and a per-GPU memory estimate for a GPT shape."""
    from .config import GPTConfig
    from .estimate import Plan, estimate, format_estimate

    try:
        config = GPTConfig(
            num_layers=num_layers,
            hidden_size=hidden_size,
            num_attention_heads=num_attention_heads or max(1, hidden_size // 64),
            ffn_hidden_size=ffn_hidden_size or None,
            seq_length=seq_length,
            max_position_embeddings=max_position_embeddings or None,
            vocab_size=vocab_size,
            make_vocab_size_divisible_by=make_vocab_size_divisible_by,
            position_embedding_type=position_embedding_type,
            tensor_model_parallel_size=tensor_model_parallel_size,
            params_dtype=params_dtype,
            activation_checkpointing=activation_checkpointing,
            sequence_parallel=sequence_parallel,
        )
        plan = Plan(
            pipeline_model_parallel_size=pipeline_model_parallel_size,
            data_parallel_size=data_parallel_size,
            micro_batch_size=micro_batch_size,
            zero_stage=zero_stage,
        )
        result = estimate(config, plan)
    except ValueError as error:
        # Config errors name the field; the CLI flag is the same name with dashes.
        message = str(error)
        for field in GPTConfig.__dataclass_fields__:
            message = re.sub(rf"\b{field}\b", "--" + field.replace("_", "-"), message)
        raise ValueError(message) from None
    typer.echo(json.dumps(result, indent=1) if as_json else format_estimate(result))


def main(argv: list[str] | None = None) -> None:
    run_app(app, prog="mds-model", distribution="mds-model", argv=argv)


if __name__ == "__main__":
    main()
