"""Runs a checkpoint's TP=2 shards as a real TP=2 GPT in 2 processes (gloo) and saves the logits.

python tp_worker.py CHECKPOINT_FOLDER TOKENS.pt OUT.pt: each rank loads
`mp_rank_{rank:02d}_model_states.pt` (the plain engine's file) into its GPT shard.
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from mds_checkpoint.engine_names import megatron_flat


def worker(rank: int, folder: str, tokens_path: str, out: str, store: str) -> None:
    from mds_checkpoint import load_consolidated
    from mds_model import GPT, ParallelGroups

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    groups = ParallelGroups.build(tensor_parallel_size=2)
    import dataclasses

    # the consolidated config keeps the TP=2 files' vocabulary rows
    config = dataclasses.replace(load_consolidated(folder).config, params_dtype="float32")
    model = GPT(config, groups=groups, init_seed=None)
    module = torch.load(Path(folder) / f"mp_rank_{rank:02d}_model_states.pt", weights_only=False)
    weights = megatron_flat(module["module"])  # mds-merge-mp nests the names as upstream does
    model.load_state_dict({k: v.float() for k, v in weights.items()})
    model.eval()
    with torch.no_grad():
        logits = model.gather_logits(model.logits(torch.load(tokens_path)))
    if rank == 0:
        torch.save(logits, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    folder, tokens_path, out = sys.argv[1:4]
    mp.spawn(worker, args=(folder, tokens_path, out, out + ".store"), nprocs=2)
