"""Upstream's example flags: the README's generated table (scripts/upstream_flags.py) still says
what mds-train does with each flag, every refused flag ends the command line in one usage line,
and the ignored and harmless ones are noted once."""

from pathlib import Path

import pytest
from mds_common.ignored_flags import MANY
from mds_train.cli import build_config, main
from mds_train.megatron_flags import IGNORED, REFUSED, classify, megatron_flags_given

from .test_config import parse

README = Path(__file__).parents[2] / "packages/train/README.md"
BEGIN, END = "<!-- upstream-flags:begin", "<!-- upstream-flags:end -->"
REQUIRED = (
    "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 8 "
    "--micro-batch-size 1 --lr 1e-3 --train-iters 1 --data-path D --vocab-file v --merge-file m"
).split()


def table_rows() -> list[tuple[str, str, str]]:
    text = README.read_text()
    block = text[text.index(BEGIN) : text.index(END)]
    rows = []
    for line in block.splitlines():
        cells = [cell.strip() for cell in line.replace("\\|", "\0").split("|")[1:-1]]
        if len(cells) == 4 and cells[0].startswith("`--"):
            rows.append((cells[0].strip("`"), cells[2], cells[3].replace("\0", "|")))
    return rows


def test_the_readme_table_is_what_the_code_does():
    rows = table_rows()
    assert len(rows) > 100  # upstream 6acc370a's scripts pass 126 of pretrain_gpt.py's flags
    stale = [(f, s, d) for f, s, d in rows if tuple(classify(f)) != (s, d)]
    assert stale == [], "rerun scripts/upstream_flags.py UPSTREAM_TREE"
    assert not [f for f, status, _ in rows if status == "unknown"]


def _value(flag) -> list[str]:
    return {0: [], 1: ["2"], MANY: ["2", "4"]}.get(flag.nargs, ["2"] * flag.nargs)


@pytest.mark.parametrize("flag", REFUSED.flags, ids=lambda f: f.names[0])
def test_a_refused_flag_is_one_usage_line(flag, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*REQUIRED, flag.names[0], *_value(flag)])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == f"mds-train: error: {flag.names[0]}: {flag.why}\n"


def test_harmless_values_of_refused_flags_and_ignored_flags_are_noted_once(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    argv = [
        *REQUIRED,
        *"--num-experts 1 --mlp-type standard --normalization layernorm".split(),
        *"--rotary-percent 1.0".split(),
        *"--cpu_torch_adam --no-gradient-accumulation-fusion".split(),
        "--no-async-tensor-model-parallel-allreduce",
        *"--moe-loss-coeff 0.01 --no-load-lr-state".split(),
    ]
    values = parse(argv)
    build_config(values)
    notes = megatron_flags_given(values)
    assert notes[:4] == [
        "--num-experts 1 is accepted and ignored: one expert per layer is the dense GPT "
        "mds-train trains",
        "--mlp-type standard is accepted and ignored: the standard MLP is mds_model's",
        "--rotary-percent 1.0 is accepted and ignored: the whole head dimension is rotated",
        "--normalization layernorm is accepted and ignored: LayerNorm is mds_model's",
    ]
    ignored = {note.split(" is accepted")[0] for note in notes[4:]}
    assert ignored == {
        "--cpu_torch_adam",
        "--no-gradient-accumulation-fusion",
        "--no-async-tensor-model-parallel-allreduce",
        "--moe-loss-coeff",
        "--no-load-lr-state",
    }


def test_no_flag_is_in_two_tables():
    own = {n for f in IGNORED.flags for n in f.names} & {n for f in REFUSED.flags for n in f.names}
    assert own == set()
    for flag in [*IGNORED.flags, *REFUSED.flags]:
        assert classify(flag.names[0]).status in ("ignored", "refused"), flag.names


def test_every_architecture_row_s_flag_is_taken_or_refused_with_gpt_config_s_reason():
    """mds_model.arguments' rows: a flag mds-train takes, or one it refuses for the reason
    GPTConfig gives for the same value."""
    from mds_model.arguments import ARGUMENTS, SWIGLU

    for argument in (*ARGUMENTS, SWIGLU):
        status, detail = classify(argument.flag)
        if argument.refusal is None:
            assert status == "works", argument.flag
        else:
            assert (status, detail.split(" (accepted")[0]) == ("refused", argument.refusal)
