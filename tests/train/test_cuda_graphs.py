"""CUDA graphs over the layers: on by default on a GPU wherever they can replay the step,
--enable-cuda-graph (Megatron-LM's flag) demands them and the settings whose layers a graph cannot
replay get one line naming the flag to change, --no-cuda-graph turns them off, a CPU refuses the
demand, and on a GPU (-m gpu) the graphed run's losses are the eager run's."""

from __future__ import annotations

from types import SimpleNamespace

import mds_model.cuda_graphs
import pytest
import torch
from mds_model.config import GPTConfig
from mds_train.cli import build_config
from mds_train.config import Topology
from mds_train.model_setup import capture_layer_graphs

from .test_config import DATA, parse

TINY = [
    *DATA,
    *"--num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 32".split(),
    *"--micro-batch-size 2 --lr 1e-3 --train-iters 5 --bf16 --enable-cuda-graph".split(),
    *"--hidden-dropout 0 --attention-dropout 0".split(),
]
ONE = Topology(world_size=1, tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
DEFAULT = [flag for flag in TINY if flag != "--enable-cuda-graph"]


def test_a_graphable_run_validates():
    config = build_config(parse(TINY))
    assert config.model.enable_cuda_graph
    config.validate(ONE)


@pytest.mark.parametrize("dropout", ["--hidden-dropout 0.1", "--attention-dropout 0.1"])
def test_dropout_is_graphed(dropout):
    config = build_config(parse([*TINY, *dropout.split()]))
    config.validate(ONE)
    assert config.uses_cuda_graphs(ONE, gpu=True)


def test_by_default_graphs_are_on_where_a_gpu_can_replay_the_step():
    config = build_config(parse(DEFAULT))
    config.validate(ONE)
    assert config.uses_cuda_graphs(ONE, gpu=True)
    assert not config.uses_cuda_graphs(ONE, gpu=False)
    off = build_config(parse([*DEFAULT, "--no-cuda-graph"]))
    off.validate(ONE)
    assert not off.uses_cuda_graphs(ONE, gpu=True)


def test_by_default_a_run_graphs_cannot_replay_runs_eagerly_without_refusal():
    config = build_config(parse([*DEFAULT, "--recompute-granularity", "full"]))
    config.validate(ONE)
    assert not config.uses_cuda_graphs(ONE, gpu=True)
    assert "drop --recompute-granularity" in config.cuda_graph_problem(ONE)


def test_zero3_at_one_data_parallel_rank_is_graphed():
    """Nothing is sharded there: the ZeRO-0 step with stage-3 files (SingleRankZero3AdamW)."""
    config = build_config(parse([*DEFAULT, "--zero-stage", "3"]))
    config.validate(ONE)
    assert config.uses_cuda_graphs(ONE, gpu=True)


@pytest.mark.parametrize("zero", ["0", "1", "2"])
def test_data_parallel_runs_are_graphed_below_zero3(zero):
    """The reduction's hooks run outside the graphs, on the replayed gradients (checked on two
    GPUs: benchmarks/train.py's zero1 and zero1-eager losses agree)."""
    two = Topology(world_size=2, tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    config = build_config(parse([*DEFAULT, "--zero-stage", zero]))
    config.validate(two)
    assert config.uses_cuda_graphs(two, gpu=True)


def test_demanding_and_refusing_graphs_contradict():
    with pytest.raises(ValueError, match="^give --enable-cuda-graph or --no-cuda-graph, not both"):
        build_config(parse([*TINY, "--no-cuda-graph"])).validate(ONE)


@pytest.mark.parametrize(
    ("given", "world", "tp", "pp", "message"),
    [
        ("--recompute-granularity full", 1, 1, 1, "drop --recompute-granularity"),
        ("--checkpoint-activations", 1, 1, 1, "drop --recompute-granularity"),
        ("--tensor-model-parallel-size 2", 2, 2, 1, "use --tensor-model-parallel-size 1"),
        ("--pipeline-model-parallel-size 2", 2, 1, 2, "use --pipeline-model-parallel-size 1"),
        ("--zero-stage 3", 2, 1, 1, "use --zero-stage 1 or 2"),
        ("--fp8-hybrid", 1, 1, 1, "drop --fp8-*"),
    ],
)
def test_what_a_graph_cannot_replay_is_refused_naming_the_flag(given, world, tp, pp, message):
    topology = Topology(
        world_size=world, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp
    )
    with pytest.raises(ValueError, match=f"^--enable-cuda-graph: .*{message}"):
        build_config(parse([*TINY, *given.split()])).validate(topology)
    by_default = build_config(parse([*DEFAULT, *given.split()]))
    by_default.validate(topology)
    assert not by_default.uses_cuda_graphs(topology, gpu=True)


def test_graphs_need_bf16():
    argv = [flag for flag in TINY if flag != "--bf16"]
    with pytest.raises(ValueError, match="^--enable-cuda-graph: checked with --bf16 only"):
        build_config(parse([*argv, "--fp16"])).validate(ONE)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a GPU")
def test_a_machine_without_a_gpu_refuses_in_one_line(capsys, shared_data):
    from mds_train.cli import main

    tokenizer = ["--vocab-file", str(shared_data / "gpt2-vocab.json")]
    tokenizer += ["--merge-file", str(shared_data / "gpt2-merges.txt")]
    with pytest.raises(SystemExit) as exit_info:
        main([*TINY, *tokenizer])
    assert exit_info.value.code == 1
    assert capsys.readouterr().err == (
        "mds-train: error: --enable-cuda-graph: CUDA graphs need a GPU; there is none here\n"
    )


def gpu_flags(runs, shared_data, data_cache, *, dropout: str = "0") -> list[str]:
    return [
        *"--num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 64".split(),
        *"--micro-batch-size 4 --global-batch-size 16 --bf16 --zero-stage 0".split(),
        *runs.OPTIMIZER,
        *runs.data_flags(shared_data, data_cache),
        *"--train-iters 8 --log-interval 1 --eval-interval 4 --eval-iters 1".split(),
        *("--hidden-dropout", dropout, "--attention-dropout", dropout),
    ]


def _assert_graphed_trains_as_eager(runs, flags, tmp_path, *, nproc: int = 1) -> None:
    """The run of `flags` with graphs (the default) gives the --no-cuda-graph run's losses over
    its 8 iterations."""
    eager, graphed = tmp_path / "eager", tmp_path / "graphed"
    result = runs.train([*flags, "--output-dir", str(eager), "--no-cuda-graph"], nproc=nproc)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "CUDA graphs captured" not in result.stderr
    result = runs.train([*flags, "--output-dir", str(graphed)], nproc=nproc)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "CUDA graphs captured for the 2 transformer layers" in result.stderr
    ours, theirs = runs.losses(graphed), runs.losses(eager)
    assert sorted(ours) == list(range(1, 9))
    for iteration in ours:
        assert ours[iteration] == pytest.approx(theirs[iteration], rel=1e-6, abs=0), iteration


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("attention", "extra"),
    [("auto", []), ("fused", []), ("auto", ["--hidden-dropout", "0.1"])],
    ids=["sdpa", "cudnn", "sdpa_hidden_dropout"],
)
def test_gpu_graphed_layers_train_as_the_eager_ones(
    runs, shared_data, data_cache, tmp_path, attention, extra
):
    """The same kernels on the same buffers: the losses of 8 iterations (4 micro-batches each,
    evaluation in between) equal the eager run's (mds-train's master weights at ZeRO-0), with
    SDPA's default attention and with cuDNN's (--attention-backend fused), and with hidden
    dropout, whose masks the replays draw at the offsets the eager kernels would. Graphs are the
    default here; --no-cuda-graph gives the eager run."""
    common = [*gpu_flags(runs, shared_data, data_cache), "--attention-backend", attention, *extra]
    _assert_graphed_trains_as_eager(runs, common, tmp_path)


@pytest.mark.gpu
@pytest.mark.multiprocess
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("zero", ["1", "2"])
def test_gpu_graphed_data_parallel_runs_train_as_the_eager_ones(
    runs, shared_data, data_cache, tmp_path, zero
):
    """Two data-parallel ranks (NCCL): the reduction's hooks copy each replayed gradient into
    its fp32 bucket and average full buckets outside the graphs (ZeRO-1 whole, ZeRO-2 each
    rank's partition); the losses of 8 iterations equal the eager run's (two H200s: to the bit)."""
    common = [*gpu_flags(runs, shared_data, data_cache), "--zero-stage", zero]
    _assert_graphed_trains_as_eager(runs, common, tmp_path, nproc=2)


@pytest.mark.gpu
def test_gpu_graphed_run_with_dropout_resumes_exactly(runs, shared_data, data_cache, tmp_path):
    """Stopped at iteration 4 and resumed, a graphed run with hidden and attention dropout
    recaptures its layers on the loaded weights and RNG state and gives the uninterrupted graphed
    run's losses bit for bit."""
    common = [*gpu_flags(runs, shared_data, data_cache, dropout="0.1"), "--enable-cuda-graph"]
    whole, parts, save = tmp_path / "whole", tmp_path / "parts", tmp_path / "ckpt"
    assert runs.train([*common, "--output-dir", str(whole)]).returncode == 0
    first = [*common, "--output-dir", str(parts), "--save", str(save)]
    assert runs.train([*first, "--exit-interval", "4"]).returncode == 0
    resumed = runs.train([*first, "--load", str(save)])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    ours, split = runs.losses(whole), runs.losses(parts)
    assert [split[i] for i in range(5, 9)] == [ours[i] for i in range(5, 9)]


@pytest.mark.gpu
def test_gpu_default_without_graphs_says_why(runs, shared_data, data_cache, tmp_path):
    flags = [*gpu_flags(runs, shared_data, data_cache), "--recompute-granularity", "full"]
    result = runs.train([*flags, "--output-dir", str(tmp_path)])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "layers run eagerly, not as CUDA graphs: activation recompute" in result.stderr


def test_a_capture_out_of_gpu_memory_says_how_to_run_eagerly(monkeypatch):
    """Graphs keep more memory reserved than the eager step: running out while capturing is one
    line naming --no-cuda-graph, not a CUDA traceback."""

    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(mds_model.cuda_graphs, "graph_layers", out_of_memory)
    gpt = SimpleNamespace(layers=[])
    engine = SimpleNamespace(module=SimpleNamespace(gpt=gpt), train=lambda: None)
    config = GPTConfig(num_layers=2, hidden_size=64, num_attention_heads=2, vocab_size=128)
    setup = SimpleNamespace(engine=engine, gpt_config=config)
    message = "^CUDA graphs: .* out of GPU memory; give --no-cuda-graph"
    with pytest.raises(ValueError, match=message):
        capture_layer_graphs(setup, micro_batch_size=2)
