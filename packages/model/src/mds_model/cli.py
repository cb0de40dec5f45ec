"""`mds-model` command line: `info` prints parameters, FLOPs per token and per-GPU memory."""

from __future__ import annotations

import json
import re
import sys

import typer

from .config import GPTConfig
from .estimate import Plan, estimate, format_estimate

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="GPT model library of mds: size and memory planning.",
)


@app.callback()
def _root() -> None:
    """Keeps `info` a subcommand even while it is the only one."""


@app.command()
def info(
    num_layers: int = typer.Option(..., help="Transformer layers (Megatron --num-layers)."),
    hidden_size: int = typer.Option(..., help="Hidden size h (Megatron --hidden-size)."),
    num_attention_heads: int = typer.Option(0, help="Attention heads; 0 means hidden_size / 64."),
    ffn_hidden_size: int = typer.Option(0, help="MLP inner size; 0 means 4 * hidden_size."),
    seq_length: int = typer.Option(1024, help="Sequence length s."),
    max_position_embeddings: int = typer.Option(0, help="Learned positions; 0 means seq_length."),
    vocab_size: int = typer.Option(50257, help="Tokenizer vocabulary size before padding."),
    make_vocab_size_divisible_by: int = typer.Option(
        128, help="Vocab padding multiple (times TP)."
    ),
    position_embedding_type: str = typer.Option("learned", help="learned, rotary or alibi."),
    tensor_model_parallel_size: int = typer.Option(1, help="Tensor-parallel size t."),
    pipeline_model_parallel_size: int = typer.Option(1, help="Pipeline stages."),
    data_parallel_size: int = typer.Option(1, help="Data-parallel replicas (for ZeRO sharding)."),
    micro_batch_size: int = typer.Option(1, help="Sequences per micro-batch per GPU."),
    zero_stage: int = typer.Option(0, help="DeepSpeed ZeRO stage 0-3."),
    params_dtype: str = typer.Option("bfloat16", help="float32, bfloat16 or float16."),
    activation_checkpointing: str = typer.Option("none", help="none, full or selective."),
    sequence_parallel: bool = typer.Option(
        False, "--sequence-parallel", help="Split LayerNorm/dropout activations over TP ranks."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the figures as JSON."),
) -> None:
    """Parameters, model FLOPs per token and a per-GPU memory estimate for a GPT shape."""
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
        typer.echo(f"mds-model info: {message}", err=True)
        raise typer.Exit(2) from None
    typer.echo(json.dumps(result, indent=1) if as_json else format_estimate(result))


def main() -> None:
    app(prog_name="mds-model")


if __name__ == "__main__":
    sys.exit(main())
