"""The training loop's exit decisions, without a training run: `Trainer._exit_reason` (when to
stop) and `Trainer._exit` (the line that says so, and the exit code) on a Trainer that holds only
the exit flags, --save and the iteration."""

import logging
import signal
import time
from types import SimpleNamespace

import pytest
import torch
from mds_common.flags import flag_fields
from mds_train.config import ExitSection
from mds_train.loop import ExitRequest, Trainer
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
    assert over == ExitRequest("exceeded --exit-duration-in-mins 30")
    [help_text] = [
        spec.help for field, spec in flag_fields(ExitSection)
        if field.name == "exit_duration_in_mins"
    ]  # fmt: skip
    assert "0 means no limit" in help_text


def test_a_signal_is_an_exit_request_that_names_it():
    stopping = trainer(exit_interval=5)
    stopping._signal = signal.SIGUSR1  # the handler's doing; it outranks the exit interval
    assert stopping._exit_reason() == ExitRequest("received SIGUSR1", signum=signal.SIGUSR1)
    assert trainer(exit_interval=5)._exit_reason() == ExitRequest("--exit-interval 5 reached")


@pytest.mark.parametrize(
    ("save", "saved", "signum", "line", "code"),
    [
        # A signal with a checkpoint saved: exit 0, as upstream's.
        ("/ckpt", True, signal.SIGTERM, "received SIGTERM, checkpoint saved", 0),
        # Nothing saved: it said `checkpoint saved` and exited 0. Now 128 + the signal's number.
        (None, False, signal.SIGTERM, "received SIGTERM, no checkpoint saved (no --save)", 143),
        (
            "/ckpt", False, signal.SIGTERM,
            "received SIGTERM, no checkpoint saved (the loss is NaN or inf; the last checkpoint "
            "stays)",
            143,
        ),
        (None, False, signal.SIGUSR1, "received SIGUSR1, no checkpoint saved (no --save)", 138),
        # An exit the run was asked for by its flags stays 0, saved or not; the line says which.
        (None, False, 0, "--exit-interval 5 reached, no checkpoint saved (no --save)", 0),
        ("/ckpt", True, 0, "--exit-interval 5 reached, checkpoint saved", 0),
    ],
)  # fmt: skip
def test_the_exit_line_says_whether_a_checkpoint_was_saved(caplog, save, saved, signum, line, code):
    stopping = trainer(save=save)
    reason = f"received {signal.Signals(signum).name}" if signum else "--exit-interval 5 reached"
    with caplog.at_level(logging.INFO, logger="mds_train.loop"):
        assert stopping._exit(ExitRequest(reason, signum=signum), saved=saved) == code
    assert caplog.messages == [f"{line}: exiting at iteration 5"]
