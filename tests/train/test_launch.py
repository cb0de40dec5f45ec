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
