"""Joining the job: the environment every launcher ends as (deepspeed, torchrun, srun, one
process)."""

from mds_train.distributed import launch_environment


def test_srun_variables_become_the_torch_environment(monkeypatch):
    monkeypatch.setattr("mds_train.distributed.subprocess.run", _no_scontrol)
    env = {
        "SLURM_PROCID": "13",
        "SLURM_NTASKS": "16",
        "SLURM_LOCALID": "5",
        "SLURM_JOB_NODELIST": "gpu[003-004,007],cpu01",
        "SLURM_JOB_ID": "123456",
    }
    info = launch_environment(env)
    assert (info.rank, info.world_size, info.local_rank, info.launcher) == (13, 16, 5, "srun")
    assert env["MASTER_ADDR"] == "gpu003" and env["MASTER_PORT"] == str(20000 + 123456 % 40000)


def test_launcher_variables_win_and_one_process_needs_none():
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "SLURM_PROCID": "7"}
    assert launch_environment(env).rank == 1  # torchrun inside an allocation: its ranks
    alone: dict[str, str] = {}
    info = launch_environment(alone)
    assert (info.rank, info.world_size, info.launcher) == (0, 1, "single process")
    assert alone["MASTER_ADDR"] == "127.0.0.1" and int(alone["MASTER_PORT"]) > 0


def _no_scontrol(*args, **kwargs):
    raise OSError("scontrol not installed")


def test_a_peer_that_left_is_told_from_other_errors():
    """What run() treats as "another process of the job left" (this rank then exits quietly)."""
    import torch.distributed as dist
    from mds_train.distributed import another_process_left

    gloo = RuntimeError(
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:30630. This is typically caused by a remote worker crashing."
    )
    store = dist.DistNetworkError("Failed to recv, got 0 bytes. Connection was likely closed.")
    assert another_process_left(gloo) and another_process_left(store)
    try:
        try:
            raise gloo
        except RuntimeError as error:
            raise ValueError("wrapped by a library") from error
    except ValueError as wrapped:
        assert another_process_left(wrapped)
    assert not another_process_left(ValueError("--micro-batch-size must be >= 1"))
    assert not another_process_left(RuntimeError("CUDA out of memory"))
