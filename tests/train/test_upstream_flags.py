"""Upstream's example flags: the generated table of packages/train/docs/upstream-flags.md
(scripts/upstream_flags.py) still says what mds-train does with each flag, every refused flag
ends the command line in one usage line, and the ignored and harmless ones are noted once."""

from pathlib import Path

import pytest
from mds_common.ignored_flags import MANY
from mds_train.cli import build_config, main
from mds_train.megatron_flags import IGNORED, REFUSED, classify, megatron_flags_given

from .test_config import parse

README = Path(__file__).parents[2] / "packages/train/docs/upstream-flags.md"
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
        *"--num-experts 1 --mlp-type standard".split(),
        *"--cpu_torch_adam --no-gradient-accumulation-fusion".split(),
        "--no-async-tensor-model-parallel-allreduce",
        *"--moe-loss-coeff 0.01 --no-load-lr-state".split(),
    ]
    values = parse(argv)
    build_config(values)
    notes = megatron_flags_given(values)
    assert notes[:2] == [
        "--num-experts 1 is accepted and ignored: one expert per layer is the dense GPT "
        "mds-train trains",
        "--mlp-type standard is accepted and ignored: the standard MLP is mds_model's",
    ]
    ignored = {note.split(" is accepted")[0] for note in notes[2:]}
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


def test_every_architecture_row_s_flag_works():
    """mds_model.arguments' rows (and --swiglu): each is a flag mds-train takes."""
    from mds_model.arguments import ARGUMENTS, SWIGLU

    for argument in (*ARGUMENTS, SWIGLU):
        assert classify(argument.flag) == ("works", ""), argument.flag


# The flag block of upstream's five Llama scripts (examples_deepspeed/
# pretrain_llama*_distributed.sh, finetune_hf_llama/finetune_llama.sh,
# universal_checkpointing/llama/run_*llama_bf16.sh).
LLAMA_BLOCK = (
    "--no-query-key-layer-scaling --attention-dropout 0 --hidden-dropout 0 "
    "--use-rotary-position-embeddings --untie-embeddings-and-output-weights --swiglu "
    "--normalization rmsnorm --disable-bias-linear"
).split()


def gpt_config_of(argv: list[str]):
    config = build_config(parse([*REQUIRED, *argv]))
    return config.model.gpt_config(
        vocab_size=100, tensor_model_parallel_size=1, params_dtype="float32"
    )


def test_upstream_s_llama_block_builds_the_llama_preset():
    """The block gives GPTConfig.preset("llama")'s fields; the GeLU flags' defaults do not
    matter (--swiglu wins, as upstream's ParallelMLP)."""
    from mds_model.config import ARCHITECTURES

    built = gpt_config_of([*LLAMA_BLOCK, "--num-key-value-heads", "1"])
    assert {name: getattr(built, name) for name in ARCHITECTURES["llama"]} == ARCHITECTURES["llama"]
    assert (built.num_query_groups, built.hidden_dropout, built.attention_dropout) == (1, 0, 0)
    assert (built.rotary_base, built.rotary_percent) == (10000.0, 1.0)  # upstream's defaults


@pytest.mark.parametrize(
    ("argv", "fields"),
    [
        (["--rotary-percent", "0.5", "--use-rotary-position-embeddings"],
         {"rotary_percent": 0.5, "position_embedding_type": "rotary"}),
        (["--rotary-position-embeddings-theta", "500000"], {"rotary_base": 500000.0}),
        (["--swiglu", "--openai-gelu"], {"activation": "swiglu"}),  # upstream's MLP: swiglu first
        (["--num-key-value-heads", "2"], {"num_query_groups": None}),  # one per head: plain MHA
    ],
    ids=["rotary-percent", "theta", "swiglu-wins", "kv-heads"],
)  # fmt: skip
def test_each_llama_flag_sets_its_gpt_config_field(argv, fields):
    built = gpt_config_of(argv)
    assert {name: getattr(built, name) for name in fields} == fields


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rotary-position-embeddings-theta", "1e6"],
         "'--rotary-position-embeddings-theta': Input should be a valid integer"),
        (["--rotary-percent", "0"], "--rotary-percent must be in (0, 1], got 0.0"),
        (["--num-key-value-heads", "0"], "--num-key-value-heads must be >= 1, got 0"),
        (["--use-rotary-position-embeddings", "--position-embedding-type", "alibi"],
         "--use-rotary-position-embeddings and --position-embedding-type alibi name two position "
         "embeddings: give one"),
        (["--num-key-value-heads", "3"],
         "--num-attention-heads (2) must be divisible by --num-key-value-heads (3)"),
    ],
    ids=["theta-is-an-integer", "percent", "kv-heads", "two-positions", "kv-heads-divide"],
)  # fmt: skip
def test_bad_llama_flag_values_are_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*REQUIRED, *argv])
    assert exit_.value.code in (1, 2)
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_key_value_heads_not_divisible_by_tp_is_one_line_naming_the_flags():
    argv = [*REQUIRED, "--num-key-value-heads", "1", "--tensor-model-parallel-size", "2"]
    config = build_config(parse(argv))
    with pytest.raises(ValueError) as error:
        config.validate(config.topology(2))
    assert str(error.value) == (
        "--num-key-value-heads (1) must be divisible by --tensor-model-parallel-size (2): each "
        "rank holds whole key/value heads"
    )


def test_fp8_checks_swiglu_s_mlp_width():
    """--swiglu without --ffn-hidden-size: upstream's int((4h x 2/3) / 64) x 64, 320 for h 128
    (not 4h = 512), whose TP=8 slice of 40 is no multiple of 16 (512's, 64, would be)."""
    argv = [*REQUIRED, "--swiglu", "--bf16", "--fp8-hybrid", "--hidden-size", "128"]
    argv += ["--num-attention-heads", "8", "--micro-batch-size", "2"]
    argv += ["--tensor-model-parallel-size", "8"]
    config = build_config(parse(argv))
    with pytest.raises(ValueError, match="--ffn-hidden-size / --tensor-model-parallel-size is 40"):
        config.validate(config.topology(8))
