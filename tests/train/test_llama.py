"""Llama-family GPTs trained from upstream's Llama flag block (examples_deepspeed/
pretrain_llama2_distributed.sh: SwiGLU, RMSNorm, no linear biases, an untied output layer,
grouped-query attention, rotary positions): the untied output layer is trained and decayed as
mds_model's parameter table says, and TP=2 x PP=2 x DP=2 (ZeRO-1, sequence parallelism, full
recompute: 8 processes) and ZeRO-3 at DP=2 give the one-process run's losses."""

from pathlib import Path

import pytest
import torch

# Upstream's block, with 2 key/value heads for the runs' 4 attention heads.
LLAMA = (
    "--no-query-key-layer-scaling --use-rotary-position-embeddings "
    "--untie-embeddings-and-output-weights --swiglu --normalization rmsnorm --disable-bias-linear "
    "--num-key-value-heads 2"
).split()
ITERATIONS = 6


def llama_config(**fields):
    from mds_model import GPTConfig

    return GPTConfig.preset(
        "llama",
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_query_groups=2,
        vocab_size=5000,
        seq_length=64,
        **fields,
    )


def test_the_untied_output_layer_is_trained_and_decayed_in_the_table_s_order():
    """The plain engine's module names it as upstream's GPTModel does and the optimizer takes
    it, in mds_model's parameter-table order (the order mds-merge-mp reads saved moments in)."""
    from mds_checkpoint.engine_names import optimizer_order
    from mds_train.model_setup import TrainingGPT, parameter_groups

    config = llama_config()
    module = TrainingGPT(config)
    engine_names = [name for name, _ in module.named_parameters()]
    assert engine_names[-1] == "language_model.output_layer.weight"
    assert not any(name.endswith("bias") for name in engine_names)  # RMSNorm, no linear biases
    plain = {id(p): n for n, p in module.gpt.named_parameters()}
    groups = parameter_groups(module, 0.1, config=config)
    assert [plain[id(p)] for group in groups for p in group["params"]] == optimizer_order(config)
    assert "output_layer.weight" in {plain[id(p)] for p in groups[0]["params"]}  # decayed
    assert module.gpt.output_layer.weight is not module.gpt.embedding.word_embeddings.weight


def test_the_untied_output_layer_gets_gradients_of_its_own():
    from mds_train.model_setup import TrainingGPT

    module = TrainingGPT(llama_config(hidden_dropout=0.0, attention_dropout=0.0))
    tokens = torch.randint(0, 5000, (2, 64))
    module(tokens, tokens.roll(-1, 1), torch.ones(2, 64)).backward()
    words = module.gpt.embedding.word_embeddings.weight.grad
    head = module.gpt.output_layer.weight.grad
    assert head is not None and head.abs().sum() > 0
    # Only the input tokens' rows of the word embeddings get gradients; the head's every row.
    assert (words.abs().sum(1) > 0).sum() <= tokens.unique().numel() < (head.abs().sum(1) > 0).sum()


def llama_run(runs, shared_data: Path, cache: Path, out: Path, *extra: str, nproc: int = 1):
    result = runs.train(
        [
            *runs.MODEL,
            *runs.OPTIMIZER,
            *runs.NO_DROPOUT,
            *runs.data_flags(shared_data, cache),
            *LLAMA,
            *f"--train-iters {ITERATIONS} --lr-decay-iters 20 --log-interval 1".split(),
            *"--eval-iters 0 --output-dir".split(),
            str(out),
            *extra,
        ],
        nproc=nproc,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def llama_reference(runs, shared_data, data_cache, tmp_path_factory) -> Path:
    """fp32, one process, no dropout: the run the parallel layouts are compared with."""
    return llama_run(runs, shared_data, data_cache, tmp_path_factory.mktemp("llama-reference"))


LAYOUTS = {
    # 8 processes: TP=2 (grouped QKV, whole key/value groups per rank; [gate_r; up_r] MLP rows;
    # vocab-parallel output layer) with Megatron's sequence parallelism, PP=2 (the untied head
    # on the last stage, LMHeadPipe, no tied embedding), DP=2 with ZeRO-1, every layer
    # recomputed in backward.
    "tp2-pp2-dp2": (
        8,
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --zero-stage 1 "
        "--sequence-parallel --recompute-granularity full".split(),
    ),
    # ZeRO-3: the untied head's weight gathered for the whole model's forward.
    "dp2-zero3": (2, ["--zero-stage", "3"]),
}


@pytest.mark.multiprocess
@pytest.mark.parametrize("layout", LAYOUTS)
def test_llama_parallel_layouts_match_one_process(
    layout, runs, llama_reference, shared_data, data_cache, tmp_path
):
    nproc, flags = LAYOUTS[layout]
    llama_run(runs, shared_data, data_cache, tmp_path, *flags, nproc=nproc)
    runs.assert_losses_match(tmp_path, llama_reference, ITERATIONS)
    # The gradient norm over every stage and rank counts the untied head once (not as a tied
    # copy): at iteration 1 the head's gradient is 0.42 of 0.67, so counting it twice or not at
    # all would move the norm by +18% or -22%. Seen 5.6e-5 relative apart (each layout sums the
    # squares in its own order).
    norms = {r["iteration"]: r["grad_norm"] for r in runs.train_records(llama_reference)}
    for record in runs.train_records(tmp_path):
        assert record["grad_norm"] == pytest.approx(norms[record["iteration"]], rel=2e-4)
