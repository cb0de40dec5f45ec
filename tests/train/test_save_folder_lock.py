"""One run at a time in a --save folder. Two runs on one folder clobbered each other: one died at
its first save with a line that did not name the cause, the other exited 0 into a folder whose
config.json was the dead run's (another seed) and whose metrics.jsonl listed iterations twice.
The second is now refused before it writes anything, naming the folder and the run that holds
it (mds_common.files.FolderLock; its own tests are tests/common/test_folder_lock.py)."""

import json
import os
import signal

import pytest
from mds_common.files import FolderLock


def test_a_second_run_on_a_save_folder_is_refused_before_it_writes(
    runs, shared_data, data_cache, tmp_path
):
    save = tmp_path / "ckpt"
    flags = [
        *runs.MODEL,
        *runs.OPTIMIZER,
        *runs.data_flags(shared_data, data_cache),
        *"--train-iters 2000 --log-interval 1 --eval-interval 1000 --eval-iters 1".split(),
        *("--save", str(save), "--save-interval", "1000"),
    ]
    first = runs.start(flags, tmp_path / "first.log")
    runs.wait_for_iteration(save, 2, first)
    config = (save / "config.json").read_bytes()
    other_seed = [*flags, "--seed", "5678"]
    second = runs.train(other_seed)
    assert second.returncode == 1, second.stderr[-3000:]
    assert first.poll() is None, "the first run ended before the second was refused"
    lines = second.stderr.strip().splitlines()
    assert lines[-1].startswith(
        f"mds-train: error: {save}: --save folder is in use by another run (pid {first.pid} on "
        "host "
    ), second.stderr[-3000:]
    assert lines[-1].endswith("; wait for it to end or give --save another folder")
    assert ": mds-train --num-layers 2 --hidden-size 64" in lines[-1]  # its command line
    assert "Traceback" not in second.stderr and "iteration" not in second.stderr
    assert (save / "config.json").read_bytes() == config  # still the first run's

    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=300) == 0
    stopped = max(runs.losses(save))
    assert "received SIGTERM, checkpoint saved" in (tmp_path / "first.log").read_text()
    assert [r["iteration"] for r in runs.train_records(save)] == list(range(1, stopped + 1))
    assert "5678" not in json.dumps(json.loads(config)["argv"])
    assert not (save / ".mds-train.lock").exists()  # removed when the run ended


@pytest.mark.multiprocess
def test_every_rank_stops_when_rank_0_is_refused(runs, shared_data, data_cache, tmp_path):
    """Rank 0 alone takes the lock; the others learn from it that the run stops, and exit 1
    without a line of their own, rather than wait in the next collective. The holder here is
    the test itself."""
    save = tmp_path / "ckpt"
    save.mkdir()
    holder = FolderLock(save, name=".mds-train.lock", command="mds-train --save elsewhere")
    assert holder.acquire()
    try:
        result = runs.train(
            [
                *runs.MODEL,
                *runs.OPTIMIZER,
                *runs.data_flags(shared_data, data_cache),
                *("--train-iters", "4", "--save", str(save)),
            ],
            nproc=2,
        )
    finally:
        holder.release()
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, result.stderr[-3000:]
    assert errors[0].startswith(
        f"mds-train: error: {save}: --save folder is in use by another run (pid {os.getpid()} on "
        "host "
    )
    assert errors[0].endswith(
        ": mds-train --save elsewhere); wait for it to end or give --save another folder"
    )
    assert "Traceback" not in result.stderr and "[rank1]" not in result.stderr
    assert list(save.iterdir()) == []  # the refused run wrote nothing there
