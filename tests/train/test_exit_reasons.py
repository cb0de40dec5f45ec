"""The training loop's exit decisions, without a training run: `Trainer._exit_reason` (when to
stop) on a Trainer that holds only the exit flags and the iteration."""

import time
from types import SimpleNamespace

import torch
from mds_common.flags import flag_fields
from mds_train.config import ExitSection
from mds_train.loop import Trainer
from mds_train.state import TrainingState


def trainer(*, iteration: int = 5, minutes_ago: float = 0.0, save=None, **exits) -> Trainer:
    config = SimpleNamespace(exit=ExitSection(**exits), checkpoint=SimpleNamespace(save=save))
    return Trainer(
        config=config, topology=None, setup=None, state=TrainingState(iteration=iteration),
        train_iters=100, lr_schedule=None, batch_schedule=None, datasets=None, checkpoint=None,
        metrics=None, rank=0, device=torch.device("cpu"), eod_mask_id=None,
        started=time.time() - 60.0 * minutes_ago,
    )  # fmt: skip


def test_exit_duration_of_zero_is_no_limit():
    """Upstream checks `if args.exit_duration_in_mins:`, so 0 is no limit; it stopped after the
    first iteration, every iteration being more than 0 minutes in."""
    assert trainer(exit_duration_in_mins=0, minutes_ago=5)._exit_reason() is None
    assert trainer(exit_duration_in_mins=None, minutes_ago=5)._exit_reason() is None
    assert trainer(exit_duration_in_mins=30, minutes_ago=29)._exit_reason() is None
    over = trainer(exit_duration_in_mins=30, minutes_ago=31)._exit_reason()
    assert over == "exceeded --exit-duration-in-mins 30"
    [help_text] = [
        spec.help for field, spec in flag_fields(ExitSection)
        if field.name == "exit_duration_in_mins"
    ]  # fmt: skip
    assert "0 means no limit" in help_text
