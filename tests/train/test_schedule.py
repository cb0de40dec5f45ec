"""The learning-rate schedule and batch-size ramp-up against values worked out by hand from
Megatron's AnnealingLR and RampupBatchsizeNumMicroBatches (package README, "Schedules")."""

import math

import pytest
from mds_train import BatchSizeSchedule, LearningRateSchedule


def schedule(style: str, **overrides) -> LearningRateSchedule:
    values = dict(max_lr=1.0, min_lr=0.1, warmup_samples=10, decay_samples=110, decay_style=style)
    values.update(overrides)
    return LearningRateSchedule(**values)


def test_warmup_starts_at_zero_and_is_linear():
    lr = schedule("cosine")
    assert [lr.lr(n) for n in (0, 1, 5, 10)] == [0.0, 0.1, 0.5, 1.0]


@pytest.mark.parametrize(
    ("style", "at_60"),
    [("linear", 0.1 + 0.9 * 0.5), ("cosine", 0.1 + 0.9 * 0.5 * (math.cos(math.pi * 0.5) + 1))],
)
def test_decay_midpoint_and_floor(style, at_60):
    lr = schedule(style)
    assert lr.lr(60) == pytest.approx(at_60)
    assert lr.lr(110) == pytest.approx(0.1)
    assert lr.lr(1000) == 0.1


def test_constant_and_inverse_square_root():
    assert schedule("constant").lr(500) == 1.0
    lr = schedule("inverse-square-root", min_lr=0.0)
    assert lr.lr(40) == pytest.approx(math.sqrt(10) / math.sqrt(40))


def test_bad_schedules_name_the_flags():
    with pytest.raises(ValueError, match="--min-lr"):
        schedule("linear", min_lr=2.0)
    with pytest.raises(ValueError, match="--lr-decay"):
        schedule("linear", decay_samples=5)


def test_rampup_follows_megatron():
    # BS test_training's --rampup-batch-size 2 2 N with --global-batch-size 16, over 70 samples:
    # 7 increments of 10 samples each.
    ramp = BatchSizeSchedule(
        global_batch_size=16, micro_batch_size=1, data_parallel_size=2, rampup=(2, 2, 70)
    )
    assert [ramp.global_batch_at(n) for n in (0, 9, 10, 25, 69, 70, 71)] == [
        2, 2, 4, 6, 14, 16, 16,
    ]  # fmt: skip
    assert ramp.num_micro_batches_at(25) == 3
    # update_train_iters: ramp iterations while consumed <= 70, then whole global batches.
    consumed, iterations = 0, 0
    while consumed <= 70:
        consumed += ramp.global_batch_at(consumed)
        iterations += 1
    assert ramp.iterations_for(1000) == iterations + (1000 - consumed) // 16


def megatron_train_iters(start: int, increment: int, ramp: int, gbs: int, train_samples: int):
    """Megatron-DeepSpeed's update_train_iters (megatron/training.py) over the rule of
    RampupBatchsizeNumMicroBatches.update (megatron/microbatches.py), transcribed."""

    def current_global_batch_size(consumed: int) -> int:
        if consumed > ramp:
            return gbs
        return start + int(consumed / (ramp / ((gbs - start) // increment))) * increment

    iterations = consumed = 0
    while consumed <= ramp:
        consumed += current_global_batch_size(consumed)
        iterations += 1
    return iterations + (train_samples - consumed) // gbs


def test_train_samples_give_megatrons_iterations_when_longer_than_the_ramp():
    ramp = BatchSizeSchedule(
        global_batch_size=12, micro_batch_size=1, data_parallel_size=1, rampup=(2, 2, 60)
    )
    assert ramp.iterations_for(150) == megatron_train_iters(2, 2, 60, 12, 150) == 21
    for train_samples in range(60, 400):
        assert ramp.iterations_for(train_samples) == megatron_train_iters(
            2, 2, 60, 12, train_samples
        ), train_samples


def test_train_samples_shorter_than_the_ramp_stop_once_consumed():
    # The bigscience seeds' ramp (2 2 1_000 to 16) over 100 samples: upstream's formula says 129
    # iterations (414 samples), a clamp of its negative term 187 (1,016); 50 batches of 2 are 100.
    seeds = BatchSizeSchedule(
        global_batch_size=16, micro_batch_size=1, data_parallel_size=1, rampup=(2, 2, 1000)
    )
    assert megatron_train_iters(2, 2, 1000, 16, 100) == 129
    assert seeds.iterations_for(100) == 50
    ramp = BatchSizeSchedule(
        global_batch_size=12, micro_batch_size=1, data_parallel_size=1, rampup=(2, 2, 60)
    )
    for train_samples in range(60):
        iterations = ramp.iterations_for(train_samples)
        consumed = 0
        for _ in range(iterations):
            consumed += ramp.global_batch_at(consumed)
        # every sample of those iterations was asked for; one more iteration would overrun
        assert consumed <= train_samples < consumed + ramp.global_batch_at(consumed)


def test_rampup_sizes_must_divide():
    with pytest.raises(ValueError, match="not a multiple"):
        BatchSizeSchedule(
            global_batch_size=16, micro_batch_size=4, data_parallel_size=1, rampup=(2, 2, 10)
        )
    with pytest.raises(ValueError, match="--global-batch-size"):
        BatchSizeSchedule(global_batch_size=10, micro_batch_size=4, data_parallel_size=1)
    with pytest.raises(ValueError, match="samples must be >= 1"):  # Megatron divides by zero
        BatchSizeSchedule(
            global_batch_size=4, micro_batch_size=1, data_parallel_size=1, rampup=(2, 2, 0)
        )
