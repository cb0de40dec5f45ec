"""--profile, --profile_steps, --profile-ranks: upstream Megatron-DeepSpeed's torch.profiler flags
(megatron/profiler.py). The trace of iterations START..END lands in --tensorboard-dir, where
benchmarks/host_profile.py reads one span per iteration; bad values are one line."""

from __future__ import annotations

import pytest

TINY = [
    *"--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 8".split(),
    *"--micro-batch-size 2 --lr 1e-3 --train-iters 5 --data-path D".split(),
]


def profiled_run(runs, shared_data, data_cache, out, *extra: str):
    flags = [
        *runs.MODEL,  # micro-batch 2, global batch 8: 4 micro-batches an iteration
        *runs.OPTIMIZER,
        *runs.NO_DROPOUT,
        *runs.data_flags(shared_data, data_cache),
        *"--train-iters 4 --log-interval 1 --eval-interval 3 --eval-iters 1".split(),
        *("--output-dir", str(out), "--tensorboard-dir", str(out / "tb")),
        *extra,
    ]
    result = runs.train(flags)
    assert result.returncode == 0, result.stderr[-3000:]
    return sorted((out / "tb").glob("*.pt.trace.json.gz"))


def test_profile_steps_2_3_trace_iterations_2_and_3(
    runs, shared_data, data_cache, tmp_path, host_profile
):
    traces = profiled_run(
        runs, shared_data, data_cache, tmp_path, "--profile", "pt", "--profile_steps", "2,3"
    )
    assert len(traces) == 1  # one rank, one trace, beside the TensorBoard events
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    steps = host_profile.summarise(host_profile.load_trace(traces[0]))
    assert [step.name for step in steps] == ["ProfilerStep#0", "ProfilerStep#1"]
    # Each micro-batch's forward embeds words and positions (2 aten::embedding); iteration 3
    # evaluates too (--eval-interval 3): 4 validation micro-batches beside the 4 training ones.
    # So the spans are iterations 2 and 3, not 1-2 or 3-4.
    assert [step.calls["aten::embedding"] for step in steps] == [8, 16]
    for step in steps:
        assert step.wall_us > 0 and step.launches == 0  # CPU: no kernels
        assert step.syncs >= 1  # the interval line reads the loss every iteration


def test_profile_ranks_leave_out_the_others(runs, shared_data, data_cache, tmp_path):
    traces = profiled_run(
        runs, shared_data, data_cache, tmp_path, "--profile", "pt", "--profile-ranks", "1", "2"
    )
    assert traces == []


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (
            "--profile pt",
            "--profile pt writes its trace into --tensorboard-dir; give --tensorboard-dir",
        ),
        (
            "--profile pt-full --profile_steps 2,3",
            "--profile pt-full writes its trace into --tensorboard-dir; give --tensorboard-dir",
        ),
        (
            "--profile_steps 3",
            "--profile_steps '3': expected START,END with integers, e.g. --profile_steps 2,3",
        ),
        (
            "--profile_steps 3,2",
            "--profile_steps '3,2': steps count from 1 and START must not exceed END, e.g. "
            "--profile_steps 2,3",
        ),
        (
            "--profile-steps 0,2",
            "--profile_steps '0,2': steps count from 1 and START must not exceed END, e.g. "
            "--profile_steps 2,3",
        ),
    ],
)
def test_profile_flags_get_one_line(capsys, shared_data, given, message):
    """Upstream's --tensorboard-dir has no default: its trace handler would fail at the end of
    the last profiled step, after the run had trained that far."""
    from mds_train.cli import main

    with pytest.raises(SystemExit) as exit_info:
        vocab = ["--vocab-file", str(shared_data / "gpt2-vocab.json")]
        main([*TINY, *vocab, "--merge-file", str(shared_data / "gpt2-merges.txt"), *given.split()])
    assert exit_info.value.code == 1
    assert capsys.readouterr().err == f"mds-train: error: {message}\n"
