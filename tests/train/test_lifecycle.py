"""How runs end and resume: kill -9 then --load continues exactly; a save killed midway leaves
`latest` on the previous checkpoint; SIGTERM, the kill switch and --exit-interval save and exit
cleanly, and SIGTERM without --save says nothing was saved and exits 143; a run whose loss stays
NaN stops without touching the last checkpoint; a checkpoint of another shape or a missing one
gets one clear line."""

import errno
import json
import os
import shutil
import signal
import traceback
from pathlib import Path

import pytest


def flags(runs, shared_data, cache, out: Path, *extra: str, iterations: int = 16) -> list[str]:
    return [
        *runs.MODEL,
        *runs.OPTIMIZER,  # dropout stays on (0.1): resuming must restore every RNG
        *runs.data_flags(shared_data, cache),
        *f"--train-iters {iterations} --log-interval 1 --eval-interval 6 --eval-iters 1".split(),
        "--output-dir",
        str(out),
        *extra,
    ]


def latest(save: Path) -> str:
    return (save / "latest").read_text()


# The saved run's length: a resume of its checkpoints gives the same --train-iters.
SAVED_ITERS = 4


@pytest.fixture(scope="module")
def saved_run(runs, shared_data, data_cache, tmp_path_factory) -> Path:
    """One run saved at iterations 1 and 2 (stopped there by --exit-interval), its checkpoints in
    ckpt/: the tests that load, damage or resume them share it (each start-up costs seconds)."""
    out = tmp_path_factory.mktemp("saved")
    saving = ["--save", str(out / "ckpt"), "--save-interval", "1", "--exit-interval", "2"]
    runs.train_ok(
        flags(runs, shared_data, data_cache, out, *saving, iterations=SAVED_ITERS), nproc=1
    )
    assert latest(out / "ckpt") == "global_step2"
    return out


@pytest.fixture
def saved(saved_run, tmp_path) -> Path:
    """This test's own copy of saved_run's checkpoints (tests cut files and rewrite `latest`)."""
    return shutil.copytree(saved_run / "ckpt", tmp_path / "ckpt")


def test_kill_9_then_load_continues_exactly(runs, shared_data, data_cache, tmp_path):
    whole, parts, save = tmp_path / "whole", tmp_path / "parts", tmp_path / "ckpt"
    result = runs.train(flags(runs, shared_data, data_cache, whole))
    assert result.returncode == 0, result.stderr[-3000:]

    process = runs.start(
        flags(runs, shared_data, data_cache, parts, "--save", str(save), "--save-interval", "4"),
        tmp_path / "killed.log",
    )
    runs.wait_for_iteration(parts, 10, process)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert latest(save) == "global_step8"
    resumed = runs.train(
        flags(runs, shared_data, data_cache, parts, "--save", str(save), "--load", str(save))
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr and "global_step8 at iteration 8" in resumed.stderr
    # metrics.jsonl holds the killed run's lines 1..10+ and the resumed run's 9..16 after them.
    records = runs.train_records(parts)
    restart = next(i for i in range(1, len(records)) if records[i]["iteration"] == 9)
    after = {r["iteration"]: r for r in records[restart:]}
    reference = {r["iteration"]: r for r in runs.train_records(whole)}
    assert sorted(after) == list(range(9, 17))
    for iteration, record in after.items():
        for key in ("lm_loss", "learning_rate", "grad_norm", "consumed_samples"):
            assert record[key] == reference[iteration][key], (iteration, key)
    validation = [json.loads(line) for line in (parts / "metrics.jsonl").read_text().splitlines()]
    assert [r["lm_loss"] for r in validation if r["event"] == "validation"][-1] == [
        json.loads(line)["lm_loss"]
        for line in (whole / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["event"] == "validation"
    ][-1]  # the validation stream resumed at the same position too
    meta = json.loads((save / "global_step16" / "meta.json").read_text())
    assert meta["iteration"] == 16 and meta["consumed_train_samples"] == 128
    assert (
        meta["model"]["padded_vocab_size"] == 5120
        and meta["parallel"]["tensor_model_parallel_size"] == 1
    )


def test_bf16_master_weights_resume_exactly(runs, shared_data, data_cache, tmp_path):
    """bf16 at ZeRO-0: the fp32 master weights and moments live in mds-train's optimizer and
    round-trip through DeepSpeed's checkpoint."""
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    bf16 = ["--bf16", "--hidden-dropout", "0", "--attention-dropout", "0"]
    # Three steps after the resume are enough to carry a lost moment (bf16 steps are slow on CPU).
    # The uninterrupted run saves at 3 and 6: it is its own reference.
    iterations, stop = 6, 3
    save = ("--save", str(whole / "ckpt"), "--save-interval", str(stop))
    result = runs.train(
        flags(runs, shared_data, data_cache, whole, *bf16, *save, iterations=iterations)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    load = ("--load", str(runs.checkpoint_at(whole, stop, tmp_path)))
    resumed = runs.train(
        flags(runs, shared_data, data_cache, parts, *bf16, *load, iterations=iterations)
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    ours, reference = runs.losses(parts), runs.losses(whole)
    assert ours == {i: reference[i] for i in range(stop + 1, iterations + 1)}
    assert reference[iterations] < reference[1]


def test_exit_interval_kill_switch_and_sigterm_save_and_exit(
    runs, shared_data, data_cache, tmp_path
):
    save, out, switch = tmp_path / "ckpt", tmp_path / "out", tmp_path / "stop-now"
    common = ["--save", str(save), "--load", str(save), "--kill-switch-path", str(switch)]
    exited = runs.train(flags(runs, shared_data, data_cache, out, *common, "--exit-interval", "3"))
    assert exited.returncode == 0, exited.stderr[-3000:]
    assert "--exit-interval 3 reached, checkpoint saved: exiting at iteration 3" in exited.stderr
    assert latest(save) == "global_step3"

    process = runs.start(flags(runs, shared_data, data_cache, out, *common), tmp_path / "ks.log")
    runs.wait_for_iteration(out, 5, process)
    switch.touch()
    assert process.wait(timeout=300) == 0
    log = (tmp_path / "ks.log").read_text()
    stopped = max(runs.losses(out))
    assert f"Detected kill switch at {switch}, iteration={stopped}" in log
    assert latest(save) == f"global_step{stopped}"
    switch.unlink()

    process = runs.start(flags(runs, shared_data, data_cache, out, *common), tmp_path / "term.log")
    runs.wait_for_iteration(out, stopped + 2, process)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=300) == 0
    log = (tmp_path / "term.log").read_text()
    assert f"resumed from {save / f'global_step{stopped}'}" in log
    assert "received SIGTERM, checkpoint saved" in log
    assert latest(save) == f"global_step{max(runs.losses(out))}"
    assert not list(save.glob("*.partial"))


def test_sigterm_without_save_says_so_and_exits_143(runs, shared_data, data_cache, tmp_path):
    """A run without --save that SIGTERM stops has nothing to save: it said `checkpoint saved`
    and exited 0. It says no checkpoint was saved and exits 143, as SIGTERM itself would end it
    (a NaN loss, never saved, is the other such case: test_exit_reasons.py)."""
    out = tmp_path / "out"
    process = runs.start(
        flags(runs, shared_data, data_cache, out, iterations=200), tmp_path / "term.log"
    )
    runs.wait_for_iteration(out, 2, process)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=300) == 128 + signal.SIGTERM
    log = (tmp_path / "term.log").read_text()
    stopped = max(runs.losses(out))
    assert (
        f"received SIGTERM, no checkpoint saved (no --save): exiting at iteration {stopped}"
    ) in log
    assert "checkpoint saved:" not in log and "Traceback" not in log


def strict_json_lines(path: Path) -> list[dict]:
    """metrics.jsonl read as JSON is specified: NaN and Infinity are not JSON."""

    def refuse(constant: str):
        raise AssertionError(f"{path}: {constant} is not JSON")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


def test_rerunning_a_finished_job_evaluates_and_exits(runs, shared_data, data_cache, tmp_path):
    """A requeued job already at --train-iters (Megatron's `train` runs no iteration, then
    evaluates): the end-of-training losses are real ones, the same as the first run's, since the
    validation stream resumes where the checkpoint left it; metrics.jsonl stays strict JSON."""
    save = tmp_path / "ckpt"
    both = ("--save", str(save), "--load", str(save))
    first = runs.train(flags(runs, shared_data, data_cache, save, *both, iterations=6))
    assert first.returncode == 0, first.stderr[-3000:]
    again = runs.train(flags(runs, shared_data, data_cache, save, *both, iterations=6))
    assert again.returncode == 0, again.stderr[-3000:]
    assert (
        "training already complete: the checkpoint is at iteration 6 and --train-iters is 6; "
        "nothing to train, evaluating only"
    ) in again.stderr
    assert "NAN" not in again.stderr.upper()
    assert sorted(p.name for p in save.glob("global_step*")) == ["global_step6"]
    records = strict_json_lines(save / "metrics.jsonl")
    assert [r["iteration"] for r in records if r["event"] == "train"] == [1, 2, 3, 4, 5, 6]
    ends = [(r["event"], r["lm_loss"]) for r in records if r.get("at", "").startswith("the end")]
    assert [event for event, _ in ends] == ["validation", "test"] * 2
    assert ends[2:] == ends[:2] and all(loss > 1.0 for _, loss in ends)


@pytest.mark.multiprocess
def test_sigterm_to_every_rank_saves_within_an_iteration(runs, shared_data, data_cache, tmp_path):
    """SLURM signals every task of the job. The ranks agree on it every iteration: before, every
    10th, so a signal after iteration 2 saved and exited at iteration 10 (at 30 s an iteration,
    past SLURM's usual 120 s warning). The resumed run continues as if never stopped."""
    whole, parts, save = tmp_path / "whole", tmp_path / "parts", tmp_path / "ckpt"
    reference = runs.train(flags(runs, shared_data, data_cache, whole, iterations=12), nproc=2)
    assert reference.returncode == 0, reference.stderr[-3000:]

    first = flags(runs, shared_data, data_cache, parts, "--save", str(save), iterations=12)
    process = runs.start(first, tmp_path / "term.log", nproc=2)
    ranks = runs.rank_processes(process, 2)
    runs.wait_for_iteration(parts, 2, process)
    for rank in ranks:
        rank.send_signal(signal.SIGTERM)
    assert process.wait(timeout=300) == 0
    stopped = max(runs.losses(parts))
    # The signal lands during iteration 2 or 3: saved after 2, 3 or (came after a rank's check
    # of 3) 4. The slack is for a loaded machine; the old interval gave 10.
    assert 2 <= stopped <= 5
    log = (tmp_path / "term.log").read_text()
    assert f"received SIGTERM, checkpoint saved: exiting at iteration {stopped}" in log
    assert latest(save) == f"global_step{stopped}"

    resumed = runs.train([*first, "--load", str(save)], nproc=2)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    records = runs.train_records(parts)
    restart = next(i for i in range(1, len(records)) if records[i]["iteration"] == stopped + 1)
    after = {r["iteration"]: r["lm_loss"] for r in records[restart:]}
    expected = runs.losses(whole)
    assert after == {i: expected[i] for i in range(stopped + 1, 13)}


@pytest.mark.multiprocess
def test_an_error_on_rank_0_is_the_only_line(runs, shared_data, data_cache, tmp_path, saved):
    """Rank 0 alone checks the --load checkpoint's files and stops on one cut short, while rank 1
    goes on to form the model's groups. Before, rank 0's line was followed by rank 1's traceback
    (the store's DistNetworkError, after a C++ warning with its stack); rank 1 now exits 1
    quietly, as it does when a collective says `Connection closed by peer`."""
    model = saved / "global_step2" / "mp_rank_00_model_states.pt"
    model.write_bytes(model.read_bytes()[:-1000])
    load = flags(
        runs,
        shared_data,
        data_cache,
        tmp_path / "dp2",
        "--load",
        str(saved),
        iterations=SAVED_ITERS,
    )
    result = runs.train(load, nproc=2)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and "[rank1]:" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith(f"mds-train: error: {model}: not a readable")


def test_a_diverging_run_stops_and_keeps_the_last_checkpoint(
    runs, shared_data, data_cache, tmp_path
):
    save, out = tmp_path / "ckpt", tmp_path / "out"
    base = flags(runs, shared_data, data_cache, out, "--save", str(save), iterations=30)
    base = [f for f in base if f not in ("--lr-warmup-iters", "3")]
    diverging = base + "--save-interval 1 --lr 1e30 --clip-grad 0 --max-nan-iterations 3".split()
    result = runs.train(diverging)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "NaN or inf for 3 iterations in a row" in errors[0]
    # Iteration 1's loss is finite; from the second on the loss is NaN: those are never saved.
    assert latest(save) == "global_step1"
    assert sorted(p.name for p in save.glob("global_step*")) == ["global_step1"]
    assert "not saving at iteration 2: the loss is NaN or inf" in result.stderr


def test_batch_size_ramp_up(runs, shared_data, data_cache, tmp_path):
    """--rampup-batch-size 4 4 24 to a global batch of 8: batches of 4 until 24 samples are
    consumed (start + int(consumed / 24) x 4, Megatron's rule), then 8; the engine's gradient
    accumulation follows, and --train-iters comes out as Megatron's update_train_iters."""
    base = flags(runs, shared_data, data_cache, tmp_path)
    for name in ("--train-iters", "--lr-warmup-iters"):  # lengths and warmup in samples instead
        base = base[: base.index(name)] + base[base.index(name) + 2 :]
    result = runs.train(
        base + "--train-samples 64 --rampup-batch-size 4 4 24 --lr-warmup-samples 8".split()
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = runs.train_records(tmp_path)
    assert [r["global_batch_size"] for r in records] == [4] * 6 + [8] * 5
    assert records[-1]["consumed_samples"] == 64
    assert all(r["lm_loss"] is not None for r in records)


def test_bad_checkpoints_get_one_line(runs, shared_data, data_cache, tmp_path, saved):
    missing = runs.train(flags(runs, shared_data, data_cache, tmp_path, "--load", "/nonexistent"))
    assert missing.returncode == 1
    assert missing.stderr.strip().splitlines()[-1] == (
        "mds-train: error: /nonexistent: --load folder does not exist"
    )
    load = flags(
        runs, shared_data, data_cache, tmp_path, "--load", str(saved), iterations=SAVED_ITERS
    )
    other_shape = list(load)
    other_shape[other_shape.index("--hidden-size") + 1] = "32"
    result = runs.train(other_shape)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"mds-train: error: {saved / 'global_step2'}: hidden_size is 64 in the checkpoint but 32 "
        "in this run; train with the checkpoint's model flags"
    )
    (saved / "latest").write_text("global_step7")
    result = runs.train(load)
    assert (
        result.returncode == 1
        and "names 'global_step7', which is not a folder"
        in (result.stderr.strip().splitlines()[-1])
    )


def test_load_of_one_checkpoint_folder_resumes_from_that_one(
    runs, shared_data, data_cache, tmp_path, saved_run, saved
):
    """--load DIR/global_step1 (as mds-merge-mp and mds-generate take a path) loads that
    checkpoint, not `latest`'s (global_step2): iteration 2 then repeats the first run's exactly."""
    second_out, tag = tmp_path / "second", saved / "global_step1"
    again = ("--load", str(tag), "--save", str(tmp_path / "again"), "--exit-interval", "2")
    second = runs.train(
        flags(runs, shared_data, data_cache, second_out, *again, iterations=SAVED_ITERS)
    )
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resumed from {tag} at iteration 1" in second.stderr
    assert runs.losses(second_out) == {2: runs.losses(saved_run)[2]}


def test_save_at_a_file_gets_one_line_before_any_work(runs, shared_data, data_cache, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    result = runs.train(
        flags(runs, shared_data, data_cache, tmp_path / "out", "--save", str(afile))
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"mds-train: error: {afile}: --save names a file, not a folder; give it a folder"
    ]
    assert afile.read_text() == "mine\n" and not (tmp_path / "out").exists()


def test_a_checkpoint_file_cut_short_gets_one_line(runs, shared_data, data_cache, tmp_path, saved):
    """A copy cut short (an interrupted transfer) failed in DeepSpeed's torch.load: 66 lines, no
    file named. Now one line naming it, before the model is built, saying which earlier
    checkpoint to load; doing that works."""
    save = saved
    model = save / "global_step2" / "mp_rank_00_model_states.pt"
    model.write_bytes(model.read_bytes()[:-1000])
    resume = flags(
        runs, shared_data, data_cache, tmp_path, "--load", str(save), iterations=SAVED_ITERS
    )
    result = runs.train(resume)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"mds-train: error: {model}: not a readable torch checkpoint file (a zip archive without "
        f"its directory: the file is cut short at {model.stat().st_size:,} bytes); the checkpoint "
        f"is damaged or incomplete: write global_step1 into {save / 'latest'} to load the one "
        "before"
    )
    (save / "latest").write_text("global_step1")
    result = runs.train(resume)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resumed from {save / 'global_step1'} at iteration 1" in result.stderr


class _HalfSavingEngine:
    """Writes some of DeepSpeed's files, then (kill) the process is killed."""

    def __init__(self, kill: bool):
        self.kill = kill

    def save_checkpoint(self, save_dir, tag, client_state, save_latest):  # noqa: ARG002
        folder = Path(save_dir) / tag
        folder.mkdir(parents=True)
        (folder / "mp_rank_00_model_states.pt").write_bytes(b"half")
        if self.kill:
            os.kill(os.getpid(), signal.SIGKILL)


def _save_in_a_child(save_dir: Path, iteration: int, kill: bool) -> int:
    """save_checkpoint in a forked process (a new interpreter would import torch again for it):
    its exit status, -9 where it was killed."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            _save(_HalfSavingEngine(kill), save_dir, iteration)
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_kill_9_during_a_save_leaves_latest_on_the_previous_checkpoint(tmp_path):
    def save(iteration: int, kill: bool) -> int:
        return _save_in_a_child(tmp_path, iteration, kill)

    assert save(5, kill=False) == 0
    assert latest(tmp_path) == "global_step5"
    assert save(10, kill=True) == -signal.SIGKILL
    assert latest(tmp_path) == "global_step5"
    assert (tmp_path / "global_step10.partial").is_dir() and not (
        tmp_path / "global_step10"
    ).exists()
    assert save(15, kill=False) == 0  # the next save clears the unfinished one
    assert latest(tmp_path) == "global_step15"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step15", "global_step5", "latest"]


class _FakeEngine:
    """DeepSpeed's save as far as the folder goes: one torch.save into the tag folder."""

    def __init__(self, target: Path | None = None):
        self.target = target  # where the model file's bytes really go (/dev/full: ENOSPC)

    def save_checkpoint(self, save_dir, tag, client_state, save_latest):  # noqa: ARG002
        folder = Path(save_dir) / tag
        folder.mkdir(parents=True)
        model = folder / "mp_rank_00_model_states.pt"
        if self.target is not None:
            model.symlink_to(self.target)
        import torch

        torch.save({"weight": torch.zeros(1 << 16)}, model)


def _run_meta():
    """A run's description as save_checkpoint reads it (the model, its topology, the tokenizer)."""
    from mds_checkpoint.meta import CheckpointMeta, Parallel, model_fields
    from mds_common.tokenizer_record import TokenizerRecord
    from mds_model import GPTConfig

    config = GPTConfig(
        num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=5000, seq_length=64
    )
    return CheckpointMeta(
        model=model_fields(config), parallel=Parallel(), tokenizer=TokenizerRecord()
    )


def _save(engine, save_dir: Path, iteration: int):
    from mds_train.checkpointing import CheckpointContext, save_checkpoint
    from mds_train.state import TrainingState

    context = CheckpointContext(
        engine=engine, rank=0, world_size=1, barrier=lambda: None, rng_tracker=None,
        meta=_run_meta(),
    )  # fmt: skip
    return save_checkpoint(context, TrainingState(iteration=iteration), save_dir)


def test_a_save_that_fills_the_disk_ends_in_one_line(tmp_path, monkeypatch):
    """torch.save's zip writer reports a full disk as RuntimeError("unexpected pos N vs M"):
    62 lines of traceback, "no space" nowhere. Its bytes go to /dev/full here, which fails every
    write with ENOSPC, and the filesystem reads as full."""
    import mds_common.files
    from mds_common.files import WriteFailed

    _save(_FakeEngine(), tmp_path, 5)
    monkeypatch.setattr(mds_common.files, "free_bytes", lambda path: 0)  # noqa: ARG005
    with pytest.raises(WriteFailed) as failed:
        _save(_FakeEngine(target=Path("/dev/full")), tmp_path, 10)
    assert str(failed.value) == (
        f"saving checkpoint global_step10 to {tmp_path}: No space left on device (0 bytes free "
        "there); free some space there or give --save another folder; `latest` still names "
        "global_step5"
    )
    assert "unexpected pos" in str(failed.value.__cause__)  # what torch itself said
    assert latest(tmp_path) == "global_step5"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step5", "latest"]


def test_an_oserror_while_saving_ends_in_one_line(tmp_path, monkeypatch):
    """A write of mds-train's own (meta.json, `latest`) that raises: its reason and file."""
    import mds_train.checkpointing
    from mds_common.files import WriteFailed

    _save(_FakeEngine(), tmp_path, 5)

    def no_space(path, text):  # noqa: ARG001
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(mds_train.checkpointing, "write_text_atomically", no_space)
    with pytest.raises(WriteFailed) as failed:
        _save(_FakeEngine(), tmp_path, 10)
    message = str(failed.value)
    assert message.startswith(
        f"saving checkpoint global_step10 to {tmp_path}: No space left on device ("
    )
    assert f"free there, writing {tmp_path / 'global_step10.partial' / 'meta.json'})" in message
    assert message.endswith("; `latest` still names global_step5")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step5", "latest"]


def test_meta_json_and_tensorboard_describe_the_run(runs, shared_data, data_cache, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    save, board = tmp_path / "ckpt", tmp_path / "tensorboard"
    tensorboard = ["--tensorboard-dir", str(board), "--log-validation-ppl-to-tensorboard"]
    tensorboard += ["--log-batch-size-to-tensorboard", "--log-timers-to-tensorboard"]
    result = runs.train(
        flags(runs, shared_data, data_cache, tmp_path, "--save", str(save), *tensorboard)
        + ["--exit-interval", "6"]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    meta = json.loads((save / "global_step6" / "meta.json").read_text())
    assert meta["format"] == "mds-train checkpoint" and meta["tool"] == "mds-train"
    assert meta["tokenizer"]["vocab_size"] == 5000 and meta["tokenizer"]["eod_id"] == 4999
    assert meta["model"]["num_layers"] == 2 and meta["parallel"]["engine"] == "plain"
    assert {"mp_rank_00_model_states.pt", "rng_state_rank00000.pt", "meta.json"} <= {
        p.name for p in (save / "global_step6").iterdir()
    }
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["config"]["model"]["hidden_size"] == 64
    assert config["deepspeed_config"]["train_micro_batch_size_per_gpu"] == 2
    events = EventAccumulator(str(board))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for tag in ("lm-loss-training/lm loss", "learning-rate/learning-rate", "grad-norm/grad-norm"):
        assert {tag, tag + " vs samples", tag + " vs tokens"} <= tags
    assert {"batch-size/batch-size", "iteration-time/tokens per second"} <= tags
    assert {
        "lm-loss-validation/lm loss validation",
        "lm-loss-validation/lm loss validation ppl",
    } <= tags
    losses = [event.value for event in events.Scalars("lm-loss-training/lm loss")]
    assert losses == pytest.approx([runs.losses(tmp_path)[i] for i in range(1, 7)])
