"""Flags, presets and the DeepSpeed config: Megatron's command lines parse unchanged, contradictions
between the flags and a user's DeepSpeed file are errors, deprecated keys are translated."""

import json
from pathlib import Path

import pytest
import typer
from mds_common.argv import ArgvError, normalise, option_specs
from mds_common.ignored_flags import MANY, TRAINING_FLAGS
from mds_train.cli import build_config, given_fields, make_app
from mds_train.config import Topology
from mds_train.ds_config import derive_deepspeed_config, merge_deepspeed_config, offloads_optimizer
from mds_train.ds_file import load_user_config, resolve_user_config
from mds_train.megatron_flags import megatron_flags_given

DATA = ["--data-path", "D", "--vocab-file", "v.json", "--merge-file", "m.txt"]

# GPT-2 345M walk-through (Megatron-DeepSpeed's examples), pretrain_gpt.py replaced by mds-train.
WALKTHROUGH_345M = """
--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --num-layers 24 --hidden-size 1024
--num-attention-heads 16 --micro-batch-size 8 --global-batch-size 64 --seq-length 1024
--max-position-embeddings 1024 --train-iters 500000 --lr-decay-iters 320000 --save ckpt --load ckpt
--data-path my-gpt2_text_document --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt
--data-impl mmap --split 949,50,1 --distributed-backend nccl --lr 0.00015 --lr-decay-style cosine
--min-lr 1.0e-5 --weight-decay 1e-2 --clip-grad 1.0 --lr-warmup-fraction .01
--checkpoint-activations
--log-interval 100 --save-interval 10000 --eval-interval 1000 --eval-iters 10 --fp16
--deepspeed --deepspeed_config ds_zero_stage_3_config.json --zero-stage 3 --partition-activations
--deepspeed-activation-checkpointing
""".split()

# bigscience's tiny test_training run.
BIGSCIENCE_TINY = """
--num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 256
--max-position-embeddings 1024 --micro-batch-size 1 --rampup-batch-size 2 2 80
--global-batch-size 16 --train-samples 160 --embed-layernorm --position-embedding-type alibi
--optimizer adam --adam-beta1 0.9 --adam-beta2 0.95 --adam-eps 1e-8 --lr 1e-4
--lr-warmup-samples 5 --clip-grad 1.0 --weight-decay 1e-1 --fp16 --log-interval 5
--save-interval 10 --eval-interval 10 --eval-iters 5 --checkpoint-activations --exit-interval 20
--merge-file gpt2-merges.txt --vocab-file gpt2-vocab.json --save out --load out
--data-path meg-gpt2_text_document --tensorboard-dir tb --tensorboard-queue-size 5
--log-timers-to-tensorboard --log-batch-size-to-tensorboard --log-validation-ppl-to-tensorboard
--deepspeed --deepspeed_config ds_config.json --zero-stage 1 --deepspeed-activation-checkpointing
--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --distributed-backend nccl
--kill-switch-path kill --codecarbon-dir cc --local_rank=0
""".split()


def parse(argv: list[str]) -> dict:
    """The parsed values, through the dialect's argv normaliser as mds-train's main does."""
    return parse_given(argv)[0]


def parse_given(argv: list[str]) -> tuple[dict, frozenset[str]]:
    """The parsed values and the names of those the user gave."""
    command = typer.main.get_command(make_app())
    args = normalise(list(argv), option_specs(command)).args
    with command.make_context("mds-train", args) as ctx:
        return dict(ctx.params), given_fields(ctx)


@pytest.mark.parametrize(
    ("argv", "world"), [(WALKTHROUGH_345M, 8), (BIGSCIENCE_TINY, 2)], ids=["345m", "bs-tiny"]
)
def test_seed_command_lines_parse(argv, world, monkeypatch):
    values = parse(argv)
    config = build_config(values)
    topology = Topology(
        world_size=world, tensor_model_parallel_size=1, pipeline_model_parallel_size=1
    )
    config.validate(topology)
    # The deepspeed launcher's --local_rank=0 beside its LOCAL_RANK=0: not the user's, no note.
    monkeypatch.setenv("LOCAL_RANK", "0")
    warnings = megatron_flags_given(values)
    assert any(w.startswith("--deepspeed-activation-checkpointing is accepted") for w in warnings)
    assert not any("local_rank" in w for w in warnings)
    monkeypatch.delenv("LOCAL_RANK")
    typed = "--local_rank=0" in argv
    assert typed == any(
        w.startswith("--local_rank is accepted") for w in megatron_flags_given(values)
    )


@pytest.mark.parametrize(
    ("given", "backend"),
    [
        ("", "auto"),
        ("--use-flash-attn", "flash"),
        ("--attention-backend flash", "flash"),
        ("--attention-backend fused", "cudnn"),
        ("--attention-backend unfused", "softmax"),
        ("--attention-backend local", "softmax"),
        ("--use-flash-attn --attention-backend flash", "flash"),
    ],
)
def test_attention_backend_takes_megatron_lms_values(given, backend):
    model = build_config(parse([*TINY, *given.split()])).model
    gpt = model.gpt_config(vocab_size=64, tensor_model_parallel_size=1, params_dtype="bfloat16")
    assert gpt.attention_backend == backend


def test_two_attention_backends_are_one_line(capsys):
    from mds_train.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main([*TINY, "--use-flash-attn", "--attention-backend", "fused"])
    assert exit_info.value.code == 1
    assert capsys.readouterr().err == (
        "mds-train: error: --use-flash-attn and --attention-backend fused name two attention "
        "backends: give one\n"
    )


def test_walkthrough_values():
    config = build_config(parse(WALKTHROUGH_345M))
    topology = Topology(world_size=8, tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    gpt = config.model.gpt_config(
        vocab_size=50257, tensor_model_parallel_size=1, params_dtype=config.params_dtype
    )
    assert gpt.padded_vocab_size == 50304 and gpt.activation_checkpointing == "full"
    lr = config.lr_schedule(topology)
    assert lr.decay_samples == 320000 * 64 and lr.warmup_samples == int(0.01 * 320000 * 64)
    assert config.train_iters(topology) == 500000


def test_bigscience_tiny_values():
    config = build_config(parse(BIGSCIENCE_TINY))
    topology = Topology(world_size=2, tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    assert config.batch.rampup_batch_size == (2, 2, 80)
    assert config.data.data_path == ("meg-gpt2_text_document",)
    assert config.lr_schedule(topology).warmup_samples == 5
    assert config.batch_schedule(topology).global_batch_at(0) == 2


def test_cross_flag_errors_name_the_flags():
    base = [
        *DATA,
        *"--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 8".split(),
        *"--micro-batch-size 2 --lr 1e-3".split(),
    ]
    topology = Topology(world_size=1, tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    for extra, message in [
        ([], "--train-iters"),
        (["--train-iters", "5", "--train-samples", "9"], "--train-iters"),
        (["--train-iters", "5", "--rampup-batch-size", "2", "2", "8"], "--train-samples"),
        (["--train-iters", "5", "--fp16", "--bf16"], "--fp16"),
        (["--train-iters", "5", "--global-batch-size", "3"], "--global-batch-size"),
    ]:
        with pytest.raises(ValueError, match=message):
            build_config(parse(base + extra)).validate(topology)
    with pytest.raises(ValueError, match="--pipeline-model-parallel-size"):
        build_config(parse(base + ["--train-iters", "5", "--zero-stage", "2"])).validate(
            Topology(world_size=2, tensor_model_parallel_size=1, pipeline_model_parallel_size=2)
        )


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("--micro-batch-size 0", "--micro-batch-size must be >= 1, got 0"),
        ("--micro-batch-size -2", "--micro-batch-size must be >= 1, got -2"),
        ("--global-batch-size 0", "--global-batch-size must be >= 1, got 0"),
        ("--seq-length 0", "--seq-length must be >= 1, got 0"),
        ("--num-attention-heads 0", "--num-attention-heads must be >= 1, got 0"),
        ("--train-iters -1", "--train-iters must be >= 0, got -1"),
        ("--eval-iters -1", "--eval-iters must be >= 0, got -1"),
        ("--log-interval 0", "--log-interval must be >= 1, got 0"),
        ("--max-nan-iterations 0", "--max-nan-iterations must be >= 1, got 0"),
    ],
)
def test_non_positive_sizes_get_one_line_naming_the_flag(capsys, given, message):
    """`--micro-batch-size 0` ended in a ZeroDivisionError, `-2` in DeepSpeed's assertion and
    `--global-batch-size 0` silently trained at micro x DP."""
    from mds_train.cli import main

    argv = [
        *DATA,
        *"--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 8".split(),
        *"--micro-batch-size 2 --lr 1e-3 --train-iters 5".split(),
        *given.split(),
    ]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 1
    assert capsys.readouterr().err == f"mds-train: error: {message}\n"


def test_unknown_flag_names_the_closest():
    with pytest.raises(ArgvError, match="did you mean --hidden-size"):
        parse([*DATA, "--hiden-size", "8"])


def test_blend_weights_and_abbreviations():
    values = parse(
        ["--data-path", "0.3", "A", "0.7", "B", "--vocab", "v.json", "--micro-batch", "2"]
        + "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 8 --lr 1".split()
    )
    assert values["data_path"] == ["0.3", "A", "0.7", "B"]
    assert values["vocab_file"] == Path("v.json") and values["micro_batch_size"] == 2


def test_toml_preset_gives_defaults_and_the_command_line_wins(tmp_path: Path):
    preset = tmp_path / "run.toml"
    preset.write_text('num-layers = 4\nhidden_size = 64\n"--lr" = 0.5\n')
    values = parse(
        ["--config", str(preset), "--lr", "0.25", "--num-attention-heads", "4", *DATA]
        + "--seq-length 8 --micro-batch-size 1 --train-iters 1".split()
    )
    assert (values["num_layers"], values["hidden_size"], values["lr"]) == (4, 64, 0.25)


def derived(argv: list[str], world: int = 2, **kwargs) -> dict:
    config = build_config(parse(argv))
    topology = Topology(
        world_size=world, tensor_model_parallel_size=1, pipeline_model_parallel_size=1
    )
    return derive_deepspeed_config(
        config, topology, pipeline_entries={}, client_optimizer=True, **kwargs
    )


def test_derived_deepspeed_config():
    ds = derived(BIGSCIENCE_TINY)
    assert ds["train_micro_batch_size_per_gpu"] == 1
    assert ds["gradient_accumulation_steps"] == 1  # the ramp starts at 2 = 1 x DP 2
    assert ds["fp16"]["initial_scale_power"] == 32 and ds["fp16"]["loss_scale"] == 0
    assert ds["gradient_clipping"] == 1.0 and ds["zero_optimization"] == {"stage": 1}
    # DeepSpeed's throughput timer would synchronize the device twice per iteration; a user's
    # file may turn it back on.
    assert ds["timers"] == {"throughput": {"enabled": False}}
    timed = {"timers": {"throughput": {"enabled": True, "synchronized": False}}}
    assert merge_deepspeed_config(ds, timed)["timers"] == timed["timers"]


def test_bf16_optimizer_paths():
    argv = [f for f in BIGSCIENCE_TINY if f != "--fp16"] + ["--bf16"]
    argv[argv.index("--zero-stage") + 1] = "0"
    # ZeRO-0 without pipelining: DeepSpeed's fp32 mode over our fp32 master weights.
    ds = derived(argv)
    assert "bf16" not in ds and "fp16" not in ds and ds["zero_optimization"]["stage"] == 0
    assert "communication_data_type" not in ds  # MasterWeightAdamW reduces in fp32 itself
    # A pipeline: DeepSpeed's BF16 optimizer, which needs ZeRO-1 with fp32 accumulation.
    config = build_config(parse(argv))
    topology = Topology(world_size=2, tensor_model_parallel_size=1, pipeline_model_parallel_size=2)
    ds = derive_deepspeed_config(config, topology, pipeline_entries={}, client_optimizer=True)
    assert ds["bf16"] == {"enabled": True} and ds["zero_optimization"]["stage"] == 1
    assert ds["data_types"] == {"grad_accum_dtype": "fp32"}


def test_fp16_runs_at_zero_stage_1():
    """DeepSpeed 0.19 scales the loss in engine.backward only for its ZeRO optimizers (its stage-0
    fp16 wrappers would divide unscaled gradients by 2^32): fp16 never runs at stage 0."""
    argv = list(BIGSCIENCE_TINY)
    argv[argv.index("--zero-stage") + 1] = "0"
    for pipeline in (1, 2):
        config = build_config(parse(argv))
        topology = Topology(
            world_size=2, tensor_model_parallel_size=1, pipeline_model_parallel_size=pipeline
        )
        ds = derive_deepspeed_config(config, topology, pipeline_entries={}, client_optimizer=True)
        assert ds["fp16"]["enabled"] and ds["zero_optimization"]["stage"] == 1


def resolved(argv: list[str], user: dict, world: int = 2, tensor_parallel: int = 1):
    """run()'s steps: the file folded into the config, the derived JSON, the file merged over it."""
    values, given = parse_given(argv)
    topology = Topology(
        world_size=world, tensor_model_parallel_size=tensor_parallel, pipeline_model_parallel_size=1
    )
    config = resolve_user_config(
        build_config(values), user, topology, given=given, source="ds.json"
    )
    config.validate(topology)
    ds = derive_deepspeed_config(config, topology, pipeline_entries={}, client_optimizer=True)
    return config, merge_deepspeed_config(ds, user)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_file_s_bf16_section_leaves_our_masters_to_deepspeed_s_fp32_mode(stage):
    """Upstream's files enable bf16 (`"bf16": {"enabled": true}`): that is --bf16, and over
    mds-train's own fp32 masters (bf16 at every stage without pipelining or offload) DeepSpeed
    still runs in its fp32 mode (its bf16 mode broke the masters' bookkeeping: a KeyError at
    start-up). Where DeepSpeed's own BF16 optimizer runs, the file's section stays."""
    from mds_train.model_setup import build_deepspeed_config

    user = {"bf16": {"enabled": True}, "zero_optimization": {"stage": stage}}
    argv = [*TINY, "--zero-stage", str(stage)]
    values, given = parse_given(argv)
    topology = Topology(world_size=2, tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    config = resolve_user_config(build_config(values), user, topology, given=given, source="f")
    assert config.precision.bf16
    ds = build_deepspeed_config(config, topology, None, user, is_pipeline=False)
    assert "bf16" not in ds and ds["zero_optimization"]["stage"] == 0
    offloaded = {
        **user,
        "zero_optimization": {"stage": stage, "offload_optimizer": {"device": "cpu"}},
    }
    if stage:  # DeepSpeed's own ZeRO optimizer, in its bf16 mode
        ds = build_deepspeed_config(config, topology, None, offloaded, is_pipeline=False)
        assert ds["bf16"] == {"enabled": True}


def test_user_config_merges_and_contradictions_fail(tmp_path: Path):
    # The seed's ZeRO-3 file: deprecated cpu_offload, an agreeing batch and fp16 section.
    seed_file = tmp_path / "ds.json"
    seed_file.write_text(
        json.dumps(
            {
                "train_batch_size": 64,
                "gradient_accumulation_steps": 1,
                "steps_per_print": 1,
                "zero_optimization": {"stage": 3, "cpu_offload": True, "overlap_comm": True},
                "gradient_clipping": 1.0,
                "fp16": {"enabled": True, "loss_scale": 0, "hysteresis": 2, "min_loss_scale": 1},
                "wall_clock_breakdown": True,
            }
        )
    )
    user = load_user_config(seed_file)
    _, merged = resolved(WALKTHROUGH_345M, user, world=8)
    assert merged["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}
    assert offloads_optimizer(merged) and merged["zero_optimization"]["overlap_comm"]
    assert merged["steps_per_print"] == 1
    # --global-batch-size 64 = micro 8 x DP 8: one micro-batch per step.
    with pytest.raises(
        ValueError,
        match=r"ds.json: 'gradient_accumulation_steps' is '4 \(a batch of 256\)' in the "
        "DeepSpeed config but --global-batch-size 64 was given; remove it from the file or "
        "change --global-batch-size",
    ):
        resolved(WALKTHROUGH_345M, {"gradient_accumulation_steps": 4}, world=8)
    with pytest.raises(ValueError, match="'zero_optimization.stage' is 2 .* --zero-stage 3 was"):
        resolved(WALKTHROUGH_345M, {"zero_optimization": {"stage": 2}}, world=8)
    broken = tmp_path / "broken.json"
    broken.write_text("{\n  'x': 1\n}")
    with pytest.raises(ValueError, match=r"broken.json:2: not valid JSON"):
        load_user_config(broken)


@pytest.mark.parametrize(
    "flag", ["--save", "--output-dir", "--tensorboard-dir", "--data-cache-path"]
)
def test_a_folder_flag_at_a_file_is_refused(tmp_path, flag):
    from mds_train.run import _check_output_folders

    afile = tmp_path / "afile"
    afile.touch()
    for path, message in (
        (afile, f"{afile}: {flag} names a file, not a folder; give it a folder"),
        (afile / "run1", f"{afile}: a file, so {flag} {afile / 'run1'} cannot be a folder in it"),
    ):
        config = build_config(parse([*BIGSCIENCE_TINY, flag, str(path)]))
        with pytest.raises(ValueError) as error:
            _check_output_folders(config)
        assert str(error.value) == message
    _check_output_folders(build_config(parse([*BIGSCIENCE_TINY, flag, str(tmp_path / "new")])))


# Issue #21, case 4: only values the user gave can contradict the file.
WALKTHROUGH_ZERO3 = [
    word
    for word in WALKTHROUGH_345M
    if word not in ("--zero-stage", "3", "--deepspeed", "--partition-activations")
]
SEED_ZERO3_FILE = {  # 000's deepspeed_config.json
    "fp16": {"enabled": True},
    "zero_optimization": {
        "stage": 3,
        "allgather_partitions": True,
        "allgather_bucket_size": 2e8,
        "overlap_comm": True,
        "reduce_scatter": True,
        "reduce_bucket_size": 2e8,
        "contiguous_gradients": True,
        "cpu_offload": True,
    },
}
BIGSCIENCE_FILE = {  # 003's and 004's ds_config.json, with MICRO_BATCH_SIZE=1, GLOBAL=16
    "train_micro_batch_size_per_gpu": 1,
    "train_batch_size": 16,
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 1},
    "fp16": {
        "enabled": True,
        "loss_scale": 0,
        "loss_scale_window": 500,
        "hysteresis": 2,
        "min_loss_scale": 1,
        "initial_scale_power": 12,
    },
    "steps_per_print": 2000,
    "wall_clock_breakdown": False,
}


def test_a_files_stage_wins_over_the_one_fp16_implies():
    """No --zero-stage given: --fp16 alone would run at ZeRO-1; the file says 3, and 3 it is."""
    config, merged = resolved(WALKTHROUGH_ZERO3, SEED_ZERO3_FILE, world=8)
    assert config.parallel.zero_stage == 3 and merged["zero_optimization"]["stage"] == 3
    assert merged["zero_optimization"]["reduce_bucket_size"] == 2e8 and merged["fp16"]["enabled"]
    with pytest.raises(ValueError, match="'zero_optimization.stage' is 3 .* --zero-stage 1 was"):
        resolved([*WALKTHROUGH_ZERO3, "--zero-stage", "1"], SEED_ZERO3_FILE, world=8)


def test_a_files_loss_scaling_wins_over_the_flags_defaults():
    config, merged = resolved(BIGSCIENCE_TINY, BIGSCIENCE_FILE)
    assert config.precision.loss_scale_window == 500 and config.precision.initial_loss_scale == 4096
    assert merged["fp16"] == {**BIGSCIENCE_FILE["fp16"]}
    with pytest.raises(ValueError, match=r"'fp16.loss_scale_window' is 500 .* --loss-scale-window"):
        resolved([*BIGSCIENCE_TINY, "--loss-scale-window", "1000"], BIGSCIENCE_FILE)


def test_a_ramp_up_starts_below_the_files_train_batch_size():
    """As upstream's set_train_batch_size(): the file's train_batch_size is the target batch
    (--global-batch-size 16), DeepSpeed starts at the ramp's 2 and follows the ramp."""
    config, merged = resolved(BIGSCIENCE_TINY, BIGSCIENCE_FILE)
    assert config.batch.global_batch_size == 16 and config.batch.rampup_batch_size == (2, 2, 80)
    assert merged["train_batch_size"] == 2 and merged["gradient_accumulation_steps"] == 1
    argv = list(BIGSCIENCE_TINY)
    argv[argv.index("--global-batch-size") + 1] = "32"
    with pytest.raises(ValueError, match="'train_batch_size' is 16 .* --global-batch-size 32 was"):
        resolved(argv, BIGSCIENCE_FILE)
    # Not given: the file's train_batch_size is the global batch.
    argv = [w for w in WALKTHROUGH_ZERO3 if w not in ("--global-batch-size", "64")]
    config, merged = resolved(argv, {"train_batch_size": 128}, world=8)
    assert config.batch.global_batch_size == 128 and merged["gradient_accumulation_steps"] == 2


def test_given_fields_are_the_typed_and_preset_ones(tmp_path: Path):
    preset = tmp_path / "run.toml"
    preset.write_text("zero-stage = 2\n")
    _, given = parse_given([*BIGSCIENCE_TINY, "--config", str(preset)])
    assert {"zero_stage", "global_batch_size", "fp16", "micro_batch_size"} <= given
    assert not given & {"loss_scale_window", "initial_loss_scale", "bf16"}
    _, given = parse_given(BIGSCIENCE_TINY)
    assert "zero_stage" in given  # --zero-stage 1 is on the bigscience line
    _, given = parse_given(WALKTHROUGH_ZERO3)
    assert "zero_stage" not in given


def test_the_training_flags_other_tools_ignore_are_mds_trains():
    """mds_common's TRAINING_FLAGS (what mds-merge-mp and mds-generate accept and ignore) names
    mds-train's own flags, with their arity: the two lists cannot drift apart unnoticed."""
    command = typer.main.get_command(make_app())
    params = {name: param for param in command.params for name in param.opts}
    for flag in TRAINING_FLAGS.flags:
        param = params.get(flag.names[0])
        assert param is not None, f"{flag.names[0]} is not an mds-train flag"
        if flag.nargs == 0:
            assert param.is_flag, flag.names[0]
        elif flag.nargs == MANY:
            assert param.multiple, flag.names[0]
        else:
            assert not param.is_flag and max(param.nargs, 1) == flag.nargs, flag.names[0]


@pytest.mark.parametrize(
    "length, warmup, message",
    [
        (
            "--train-samples 64",
            "--lr-warmup-iters 3",
            "with --train-samples give --lr-warmup-samples",
        ),
        ("--train-iters 8", "--lr-warmup-samples 8", "with --train-iters give --lr-warmup-iters"),
    ],
)
def test_a_warmup_in_the_other_unit_is_refused(length, warmup, message):
    """Megatron's validate_args asserts a warmup in the run's own unit; mds read only that unit
    and silently ran the other one without a warmup."""
    flags = list(BIGSCIENCE_TINY)
    for name in ("--train-samples", "--lr-warmup-samples", "--rampup-batch-size"):
        at = flags.index(name)
        del flags[at : at + (4 if name == "--rampup-batch-size" else 2)]
    config = build_config(parse([*flags, *length.split(), *warmup.split()]))
    with pytest.raises(ValueError, match=message):
        config.validate(
            Topology(world_size=1, tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
        )


TINY = [
    *DATA,
    *"--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 8".split(),
    *"--micro-batch-size 2 --lr 1e-3 --train-iters 5".split(),
]


@pytest.mark.parametrize(
    ("given", "checkpointing"),
    [
        ("", "none"),
        ("--checkpoint-activations", "full"),
        ("--recompute-granularity selective", "selective"),
        ("--recompute-granularity full", "full"),
        # upstream's rebase/ds_pretrain_gpt_1.3B_megatron_checkpointing.sh: every layer on its own
        (
            "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1",
            "full",
        ),
        # upstream recomputes nothing without a granularity, whatever the method says
        ("--recompute-method uniform", "none"),
    ],
)
def test_recompute_flags_choose_the_models_checkpointing(given, checkpointing):
    model = build_config(parse([*TINY, *given.split()])).model
    config = model.gpt_config(vocab_size=64, tensor_model_parallel_size=1, params_dtype="float32")
    assert config.activation_checkpointing == checkpointing


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (
            "--recompute-granularity selective --recompute-method uniform",
            "--recompute-method applies to --recompute-granularity full, not selective; drop it",
        ),
        (
            "--recompute-granularity full --recompute-method block --recompute-num-layers 4",
            "--recompute-method block (recompute only the first --recompute-num-layers layers of "
            "each stage) is not supported: mds_model recomputes every layer; use "
            "--recompute-method uniform --recompute-num-layers 1, or --recompute-granularity "
            "selective to save less memory for less recompute",
        ),
        (
            "--recompute-granularity full --recompute-method uniform --recompute-num-layers 2",
            "--recompute-num-layers 2: mds_model recomputes each layer on its own (upstream's "
            "uniform method with units of 1 layer); use --recompute-num-layers 1",
        ),
    ],
)
def test_recompute_methods_other_than_each_layer_get_one_line(capsys, given, message):
    """These were accepted and ignored: a run asking for fewer recomputed layers (block) or
    larger recomputed units (uniform N > 1) silently got a different memory and speed trade-off."""
    from mds_train.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main([*TINY, *given.split()])
    assert exit_info.value.code == 1
    assert capsys.readouterr().err == f"mds-train: error: {message}\n"


def test_every_architecture_flag_of_mds_train_is_mds_model_info_s():
    """Both take mds_model.flags.GPTFlags; the flags only mds-train has (a non-default value of
    each, where it is valid) change no GPTConfig field a checkpoint records as architecture."""
    from mds_common.flags import flag_fields
    from mds_model.cli import InfoFlags
    from mds_model.config import ARCHITECTURE, TUNABLE, GPTConfig
    from mds_model.flags import GPTFlags
    from mds_train.config import ModelSection

    names = GPTConfig.fields_of_kind(ARCHITECTURE) + GPTConfig.fields_of_kind(TUNABLE)
    sizes = dict(num_layers=2, hidden_size=16, num_attention_heads=2, seq_length=8)

    def architecture(**given) -> dict:
        config = ModelSection(**sizes, **given).gpt_config(
            vocab_size=64, tensor_model_parallel_size=1, params_dtype="float32"
        )
        return {name: getattr(config, name) for name in names}

    info_flags = {name for _, spec in flag_fields(InfoFlags) for name in spec.names}
    assert {name for _, spec in flag_fields(GPTFlags) for name in spec.names} <= info_flags
    assert {"--embed-layernorm", "--openai-gelu", "--no-bias-gelu-fusion", "--onnx-safe"} <= (
        info_flags
    )
    gpt2, tried = architecture(), 0
    for field, spec in flag_fields(ModelSection):
        if set(spec.names) <= info_flags:
            continue
        if spec.choices:
            values = spec.choices
        elif isinstance(field.default, bool):
            values = (not field.default,)
        elif isinstance(field.default, int | float):
            values = (field.default * 2, field.default / 2)
        else:
            values = ("1",)
        for value in values:
            try:
                changed = architecture(**{field.name: value})
            except ValueError:
                continue  # refused on its own (--recompute-method block)
            assert changed == gpt2, spec.names
            tried += 1
    assert tried >= 10
