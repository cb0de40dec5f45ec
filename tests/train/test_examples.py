"""The scripts in examples/ hold mds-train command lines that parse and validate as written: the
seeds' GPT-2 345M walk-through (with its ZeRO-3 offload file), bigscience's tiny run, the GPT-3
175B layout, GPT-3 XL (1.3B) on 8 GPUs, and the SLURM batch script."""

import re
import shlex
from pathlib import Path

import pytest
import typer
from mds_common.argv import normalise, option_specs
from mds_train.cli import build_config, make_app
from mds_train.config import Topology
from mds_train.ds_config import derive_deepspeed_config, merge_deepspeed_config
from mds_train.ds_file import load_user_config, resolve_user_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# script: the world it is written for (GPUs).
WORLDS = {
    "gpt2_345m.sh": 8,
    "bigscience_tiny.sh": 2,
    "gpt3_175b.sh": 128,
    "gpt3_xl_1.3b.sh": 8,
    "pretrain_gpt_345m.sbatch": 16,
}


def mds_train_arguments(script: Path) -> list[str]:
    """The words after `--module mds_train` or `srun mds-train`, variables given stand-in values."""
    text = script.read_text().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if re.search(r"mds_train|srun mds-train", line))
    words = shlex.split(re.sub(r'"?\$\{?(\w+)[^"\s]*"?', r"\1", line))
    start = words.index("mds_train" if "mds_train" in words else "mds-train") + 1
    return words[start:]


def parse(argv: list[str]) -> dict:
    command = typer.main.get_command(make_app())
    with command.make_context("mds-train", normalise(argv, option_specs(command)).args) as ctx:
        return dict(ctx.params)


@pytest.mark.parametrize("name", sorted(WORLDS))
def test_example_command_lines_validate(name):
    values = parse(mds_train_arguments(EXAMPLES / name))
    config = build_config(values)
    topology = config.topology(WORLDS[name])
    config.validate(topology)
    assert topology.data_parallel_size >= 1


def test_the_walkthroughs_deepspeed_file_merges():
    config = build_config(parse(mds_train_arguments(EXAMPLES / "gpt2_345m.sh")))
    topology = Topology(world_size=8, tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    user = load_user_config(EXAMPLES / "ds_zero3_offload.json")
    config = resolve_user_config(
        config, user, topology, given=frozenset(), source="ds_zero3_offload"
    )
    derived = derive_deepspeed_config(config, topology, pipeline_entries={}, client_optimizer=True)
    merged = merge_deepspeed_config(derived, user)
    assert merged["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}
    assert merged["zero_optimization"]["stage"] == 3 and merged["fp16"]["enabled"]


def test_every_example_is_covered():
    scripts = {p.name for p in EXAMPLES.iterdir() if p.suffix in (".sh", ".sbatch")}
    assert scripts == set(WORLDS)
