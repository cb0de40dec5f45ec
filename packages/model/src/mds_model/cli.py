"""`mds-model` command line: `info` prints parameters, FLOPs per token and per-GPU memory.

Parsing, errors and exit codes follow the shared dialect (`mds_common.cli`, docs/cli.md); the model
code (and torch) is imported inside the command, so `--help` and `--version` stay fast.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import typer
from mds_common.cli import new_app, run_app, run_then_exit
from mds_common.flags import command_function, flag, group_from_values, restate

from .flags import GPTFlags, MicroBatchFlags, ParallelFlags

app = new_app("GPT model library of mds: size and memory planning.")


@app.callback()
def _root() -> None:
    """Keeps `info` a subcommand even while it is the only one."""


@dataclass(frozen=True, kw_only=True)
class InfoFlags(ParallelFlags, GPTFlags):
    """`mds-model info`: the GPT and layout flags (mds_model.flags) and the plan's."""

    num_layers: int = restate(GPTFlags, "num_layers", required=True)
    hidden_size: int = restate(GPTFlags, "hidden_size", required=True)
    num_attention_heads: int | None = restate(
        GPTFlags, "num_attention_heads", shown_default="hidden size / 64"
    )
    seq_length: int = restate(GPTFlags, "seq_length", default=1024)
    vocab_size: int = flag(
        "--vocab-size", default=50257, help="Tokenizer vocabulary size before padding."
    )
    data_parallel_size: int = flag(
        "--data-parallel-size", default=1, help="Data-parallel replicas (for ZeRO sharding)."
    )
    micro_batch_size: int = restate(MicroBatchFlags, "micro_batch_size")
    global_batch_size: int | None = flag(
        "--global-batch-size",
        default=None,
        shown_default="micro-batch x data-parallel size",
        help="Sequences per optimizer step over all replicas (sets gradient accumulation).",
    )
    params_dtype: str = flag(
        "--params-dtype", default="bfloat16", help="float32, bfloat16 or float16."
    )
    activation_checkpointing: str = flag(
        "--activation-checkpointing", default="none", help="none, full or selective."
    )
    as_json: bool = flag("--json", default=False, help="Print the figures as JSON.")


def _info(**values: Any) -> None:
    from .config import GPTConfig, for_tensor_parallel
    from .estimate import Plan, estimate, format_estimate

    try:
        flags = group_from_values(InfoFlags, values)
        fields = flags.gpt_fields()
        fields.setdefault("num_attention_heads", max(1, flags.hidden_size // 64))
        tp = flags.tensor_model_parallel_size
        model = GPTConfig(
            **fields,
            vocab_size=flags.vocab_size,
            params_dtype=flags.params_dtype,
            activation_checkpointing=flags.activation_checkpointing,
        )
        config = for_tensor_parallel(model, tp)
        plan = Plan(
            tensor_model_parallel_size=tp,
            pipeline_model_parallel_size=flags.pipeline_model_parallel_size,
            data_parallel_size=flags.data_parallel_size,
            micro_batch_size=flags.micro_batch_size,
            zero_stage=flags.zero_stage,
            global_batch_size=flags.global_batch_size,
        )
        result = estimate(config, plan)
    except ValueError as error:
        # Config errors name the field; the CLI flag is the same name with dashes, or upstream's
        # flag where mds_model.arguments' row spells it otherwise (--num-key-value-heads).
        from .arguments import ARGUMENT_OF

        message = str(error)
        for field in (*GPTConfig.__dataclass_fields__, "tensor_model_parallel_size"):
            row = ARGUMENT_OF.get(field)
            spelled = row.flag if row is not None else "--" + field.replace("_", "-")
            message = re.sub(rf"(?<!-)\b{field}\b", spelled, message)
        raise ValueError(message) from None
    typer.echo(json.dumps(result, indent=1) if flags.as_json else format_estimate(result))


app.command("info")(
    command_function(
        _info,
        [InfoFlags],
        name="info",
        doc="Parameters, model FLOPs per token and a per-GPU memory estimate for a GPT shape.",
    )
)


def main(argv: list[str] | None = None) -> None:
    run_app(app, prog="mds-model", distribution="mds-model", argv=argv)


def script() -> None:
    """The `mds-model` command (and `python -m mds_model`): `main()`, then the process ends without
    tearing the interpreter down (mds_common.cli.run_then_exit: torch's modules are not cleared
    one by one after the command's output is written)."""
    run_then_exit(main)


if __name__ == "__main__":
    script()
