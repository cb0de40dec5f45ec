"""mds-model info: parameter count, FLOPs per token and the per-GPU memory estimate, and its CLI."""

import json
import subprocess
import sys

import pytest
from mds_model.cli import app
from mds_model.config import ARCHITECTURES, GPTConfig, for_tensor_parallel
from mds_model.estimate import Plan, estimate, flops_per_token, total_parameters
from mds_model.gpt import GPT
from typer.testing import CliRunner

GPT2_345M = dict(
    num_layers=24, hidden_size=1024, num_attention_heads=16, vocab_size=50257, seq_length=1024
)


def test_345m_parameters_match_reference_gpt():
    config = GPTConfig(**GPT2_345M)
    # reference_gpt.py's count for the same shape (vocab 50304, 1024 learned positions, tied head).
    assert total_parameters(config) == 354_871_296
    assert (
        total_parameters(config, exclude_embeddings=True)
        == 354_871_296 - 50304 * 1024 - 1024 * 1024
    )


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"position_embedding_type": "alibi", "embed_layernorm": True},
        {"ffn_hidden_size": 40},
        {**ARCHITECTURES["llama"], "num_query_groups": 2},
    ],
)
def test_parameter_count_equals_the_built_model(overrides):
    config = GPTConfig(
        num_layers=3,
        hidden_size=32,
        num_attention_heads=4,
        vocab_size=100,
        seq_length=16,
        **overrides,
    )
    assert total_parameters(config) == GPT(config).num_parameters()
    assert total_parameters(config, exclude_embeddings=True) == GPT(config).num_parameters(
        exclude_embeddings=True
    )


def test_llama_flops_count_upstream_s_products():
    """Upstream's throughput_calculator (megatron/utils.py at 6acc370a), per token, with 2 / gqa
    where it writes the integer 2 // gqa: the layer products and attention agree; the logits keep
    the Narayanan formula's V/16Lh (1.5 V h per pass) where upstream counts 2 V h."""
    config = GPTConfig.preset(
        "llama",
        num_layers=4,
        hidden_size=256,
        num_attention_heads=8,
        num_query_groups=2,
        ffn_hidden_size=688,
        vocab_size=1000,
        seq_length=128,
    )
    L, h, s, V, ffn, gqa = 4, 256, 128, config.padded_vocab_size, 688, 8 // 2
    upstream_macs = L * (1 + 2 / gqa + 1) * h**2 + L * 2 * h * s + L * 3 * ffn * h + V * h
    upstream = 2 * 3 * upstream_macs
    ours = flops_per_token(config)["megatron_no_recompute"]
    assert ours - 3 * 1.5 * V * h == pytest.approx(upstream - 6 * V * h)


def test_flops_per_token_formulas():
    config = GPTConfig(**GPT2_345M)
    flops = flops_per_token(config)
    L, h, s, V = 24, 1024, 1024, 50304
    assert flops["palm_6n_plus_attention"] == 6 * 354_871_296 + 12 * L * h * s
    megatron = 72 * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))  # reference 5.4, per token
    assert flops["megatron_no_recompute"] == pytest.approx(megatron)
    assert flops["megatron_with_recompute"] == pytest.approx(megatron * 4 / 3)


def test_memory_shards_with_zero_and_tensor_parallelism():
    config = GPTConfig(**GPT2_345M, params_dtype="bfloat16")
    base = estimate(config, Plan(data_parallel_size=8))["memory_bytes_per_gpu"]
    n = 354_871_296
    # bf16 at ZeRO 0-1: bf16 gradients and the optimizer's full-size fp32 gradient buffer
    assert base["weights"] == 2 * n and base["gradients"] == 6 * n and base["optimizer"] == 12 * n
    z1 = estimate(config, Plan(data_parallel_size=8, zero_stage=1))["memory_bytes_per_gpu"]
    z2 = estimate(config, Plan(data_parallel_size=8, zero_stage=2))["memory_bytes_per_gpu"]
    z3 = estimate(config, Plan(data_parallel_size=8, zero_stage=3))["memory_bytes_per_gpu"]
    assert z1["optimizer"] == 12 * n / 8 and z1["gradients"] == 6 * n
    # ShardedMasterAdamW's ZeRO-2: the bf16 gradients whole, the fp32 ones partitioned
    assert z2["gradients"] == 2 * n + 4 * n / 8 and z2["optimizer"] == 12 * n / 8
    # mds-train's ZeRO-3 (FSDP2): fp32 weight shards (the masters), fp32 gradient shards, moments
    assert (z3["weights"], z3["gradients"], z3["optimizer"]) == (4 * n / 8, 4 * n / 8, 8 * n / 8)
    fp16 = GPTConfig(**GPT2_345M, params_dtype="float16")
    assert estimate(fp16, Plan(zero_stage=1))["memory_bytes_per_gpu"]["gradients"] == 2 * n
    tp2 = for_tensor_parallel(GPTConfig(**GPT2_345M, params_dtype="bfloat16"), 2)
    assert estimate(tp2, Plan(tensor_model_parallel_size=2))["parameters_per_gpu"] < 0.55 * n
    pp2 = estimate(config, Plan(pipeline_model_parallel_size=2))["parameters_per_gpu"]
    assert pp2 < 0.7 * n


def test_bf16_gradients_have_an_fp32_buffer_only_where_mds_train_allocates_one():
    """MasterWeightAdamW (bf16, ZeRO-0) and ShardedMasterAdamW (ZeRO-1/2), without a pipeline,
    read the bf16 gradients as they are with one replica and one micro-batch per step
    (mds_train.model_setup sets up no fp32 reduction); accumulation, DP > 1 or a pipeline
    (DeepSpeed's BF16 optimizer) keep the buffer."""
    config = GPTConfig(**GPT2_345M, params_dtype="bfloat16")
    n = 354_871_296

    def gradients(**plan) -> float:
        return estimate(config, Plan(**plan))["memory_bytes_per_gpu"]["gradients"]

    assert gradients() == 2 * n
    assert gradients(micro_batch_size=8, global_batch_size=8) == 2 * n
    assert gradients(micro_batch_size=8, global_batch_size=16) == 6 * n  # 2 micro-batches
    assert gradients(data_parallel_size=2) == 6 * n
    pp2 = estimate(config, Plan(pipeline_model_parallel_size=2))
    assert pp2["memory_bytes_per_gpu"]["gradients"] == 6 * pp2["parameters_per_gpu"]
    assert gradients(zero_stage=1) == gradients(zero_stage=2) == 2 * n
    assert gradients(zero_stage=1, data_parallel_size=2) == 6 * n
    with pytest.raises(ValueError, match="--global-batch-size 12 must be a positive multiple"):
        Plan(micro_batch_size=8, global_batch_size=12)


def test_gpt3_xl_estimate_against_the_measured_peak():
    """GPT-3 XL, micro-batch 8, bf16, ZeRO-0, one H100 (benchmarks/results/
    train_speed_h100_202611.md, 2026-11-27): the eager peak allocated 44.5 GiB, the graphed run
    reserved 48.5 GiB. The estimate lies between them (within 5% of each)."""
    config = GPTConfig(
        num_layers=24,
        hidden_size=2048,
        num_attention_heads=16,
        seq_length=2048,
        max_position_embeddings=2048,
        vocab_size=50257,
        params_dtype="bfloat16",
    )
    total = estimate(config, Plan(micro_batch_size=8))["memory_bytes_per_gpu"]["total"] / 2**30
    assert 44.5 < total < 48.5
    assert total == pytest.approx(44.5, rel=0.05) and total == pytest.approx(48.5, rel=0.05)


def test_activation_memory_follows_korthikanti():
    s, b, h, a, L = 1024, 4, 1024, 16, 24
    kwargs = dict(GPT2_345M, params_dtype="bfloat16", attention_backend="softmax")
    full = estimate(GPTConfig(**kwargs), Plan(micro_batch_size=b))["memory_bytes_per_gpu"][
        "activations"
    ]
    logits = s * b * 50304 * 2
    assert full - logits == pytest.approx(L * s * b * h * (34 + 5 * a * s / h))
    sel = GPTConfig(**kwargs, activation_checkpointing="selective")
    assert estimate(sel, Plan(micro_batch_size=b))["memory_bytes_per_gpu"][
        "activations"
    ] - logits == (pytest.approx(L * s * b * h * 34))
    ckpt = GPTConfig(**kwargs, activation_checkpointing="full")
    assert estimate(ckpt, Plan(micro_batch_size=b))["memory_bytes_per_gpu"][
        "activations"
    ] - logits == (pytest.approx(L * 2 * s * b * h))


def test_info_cli_prints_the_figures():
    result = CliRunner().invoke(
        app,
        [
            "info",
            "--num-layers",
            "24",
            "--hidden-size",
            "1024",
            "--num-attention-heads",
            "16",
            "--micro-batch-size",
            "16",
            "--zero-stage",
            "1",
            "--data-parallel-size",
            "8",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "padded vocab size        50304" in result.output
    assert "parameters               354,871,296 (354.9M)" in result.output
    assert "ZeRO-1" in result.output and "optimizer" in result.output
    as_json = CliRunner().invoke(
        app, ["info", "--num-layers", "2", "--hidden-size", "64", "--json"]
    )
    assert json.loads(as_json.output)["padded_vocab_size"] == 50304


def test_info_takes_mds_train_s_architecture_flags():
    """BLOOM's embedding LayerNorm adds its 2 x hidden parameters; the GeLU flags parse as
    mds-train's (the estimate does not depend on the GeLU)."""
    shape = ["info", "--num-layers", "2", "--hidden-size", "64", "--json"]

    def config(*flags: str) -> dict:
        result = CliRunner().invoke(app, [*shape, *flags])
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    plain = config()
    bloom = config("--embed-layernorm", "--position-embedding-type", "alibi")
    assert (
        bloom["config"]["embed_layernorm"] and bloom["config"]["position_embedding_type"] == "alibi"
    )
    # alibi drops the learned position table (1024 x 64), the embedding LayerNorm adds 2 x 64
    assert bloom["parameters"] - plain["parameters"] == 2 * 64 - 1024 * 64
    assert plain["config"]["activation"] == "gelu_tanh"
    assert config("--no-bias-gelu-fusion")["config"]["activation"] == "gelu"
    assert config("--no-bias-gelu-fusion", "--openai-gelu")["config"]["activation"] == "gelu_tanh"
    assert config("--layernorm-epsilon", "1e-6")["config"]["layernorm_epsilon"] == 1e-6


def test_info_cli_bad_flag_is_one_line_naming_the_flag():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mds_model",
            "info",
            "--num-layers",
            "2",
            "--hidden-size",
            "64",
            "--num-attention-heads",
            "4",
            "--tensor-model-parallel-size",
            "3",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        "mds-model info: error: --num-attention-heads (4) must be divisible by "
        "--tensor-model-parallel-size (3)"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mds_model",
            "info",
            "--num-layers",
            "2",
            "--hidden-size",
            "64",
            "--zero-stage",
            "5",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip() == "mds-model info: error: --zero-stage must be 0, 1, 2 or 3, got 5"


def test_sequence_parallel_splits_the_activations_outside_tp_regions():
    s, b, h, t, L = 1024, 2, 1024, 4, 24
    kwargs = dict(GPT2_345M, params_dtype="bfloat16")
    logits = s * b * 50688 // t * 2  # 50257 padded to a multiple of 128 * 4
    plan = Plan(tensor_model_parallel_size=t, micro_batch_size=b)
    plain = estimate(for_tensor_parallel(GPTConfig(**kwargs), t), plan)["memory_bytes_per_gpu"]
    sp = estimate(for_tensor_parallel(GPTConfig(**kwargs, sequence_parallel=True), t), plan)
    assert plain["activations"] - logits == pytest.approx(L * s * b * h * (10 + 24 / t))
    assert sp["memory_bytes_per_gpu"]["activations"] - logits == pytest.approx(
        L * s * b * h * 34 / t
    )
    result = CliRunner().invoke(
        app,
        [
            "info",
            "--num-layers",
            "2",
            "--hidden-size",
            "128",
            "--tensor-model-parallel-size",
            "2",
            "--sequence-parallel",
        ],
    )
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--num-layers", "4", "--pipeline-model-parallel-size", "8"],
            "--pipeline-model-parallel-size 8 exceeds --num-layers 4: every pipeline stage needs "
            "at least one layer; use at most as many stages as layers",
        ),
        (
            ["--num-layers", "4", "--pipeline-model-parallel-size", "2", "--zero-stage", "3"],
            "--zero-stage 3 with --pipeline-model-parallel-size 2: DeepSpeed's pipeline engine "
            "supports ZeRO stage 0 or 1 only",
        ),
    ],
)
def test_info_cli_refuses_impossible_plans(tmp_path, flags, message):
    proc = subprocess.run(
        [sys.executable, "-m", "mds_model", "info", "--hidden-size", "64", *flags],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.splitlines() == [f"mds-model info: error: {message}"]
    assert list(tmp_path.iterdir()) == []


def test_estimate_refuses_more_stages_than_layers():
    config = GPTConfig(num_layers=4, hidden_size=64, num_attention_heads=1, vocab_size=100)
    with pytest.raises(ValueError, match="--pipeline-model-parallel-size 8 exceeds --num-layers 4"):
        estimate(config, Plan(pipeline_model_parallel_size=8))


def test_uneven_layers_per_stage_count_the_busiest_stage():
    config = GPTConfig(num_layers=5, hidden_size=64, num_attention_heads=1, vocab_size=100)
    three = estimate(config, Plan(pipeline_model_parallel_size=2))["parameters_per_gpu"]
    even = GPTConfig(num_layers=6, hidden_size=64, num_attention_heads=1, vocab_size=100)
    assert three == estimate(even, Plan(pipeline_model_parallel_size=2))["parameters_per_gpu"]


def test_the_bf16_optimizer_s_all_reduce_bucket():
    """DeepSpeed's buffered all-reduce under the BF16 optimizer (a bf16 pipeline): buckets past
    5e8 elements, fp32 flattened and cast to bf16 (6 bytes per element); other engines (mds-train's
    own ZeRO-1/2 without a pipeline among them) count none."""
    config = GPTConfig(**GPT2_345M, params_dtype="bfloat16")
    pp2 = estimate(config, Plan(zero_stage=1, pipeline_model_parallel_size=2))
    assert pp2["memory_bytes_per_gpu"]["buffers"] == pp2["parameters_per_gpu"] * 6  # one bucket
    assert estimate(config, Plan(zero_stage=1))["memory_bytes_per_gpu"]["buffers"] == 0
    big = GPTConfig(
        num_layers=2,
        hidden_size=12288,
        num_attention_heads=96,
        seq_length=2048,
        vocab_size=50257,
        params_dtype="bfloat16",
    )
    plan = Plan(zero_stage=1, pipeline_model_parallel_size=2)
    bucket = estimate(big, plan)["memory_bytes_per_gpu"]["buffers"]
    assert bucket == (500_000_000 + 50304 * 12288) * 6  # the word embeddings close it
    fp32 = GPTConfig(**GPT2_345M, params_dtype="float32")
    assert estimate(fp32, Plan(zero_stage=1))["memory_bytes_per_gpu"]["buffers"] == 0
    assert estimate(config, Plan(zero_stage=2))["memory_bytes_per_gpu"]["buffers"] == 0
