"""One rank of test_grad_sync: trains the shared tiny model's gradients over gloo through
GradientReduction (`bucketed`: saves the fp32 master gradients of two steps) or ZeRO-1/2's
ShardedGradientReduction (`zero1`, `zero2`: saves this rank's partition gradients of two steps,
its slices of each flat group end to end, with each group's buckets).

    python grad_sync_worker.py RANK WORLD_SIZE PORT {float32,bfloat16} OUT.pt [MODE]
"""

import os
import sys

import torch
import torch.distributed as dist
from mds_train.grad_sync import GradientReduction, ShardedGradientReduction
from mds_train.sharded_master_weights import flatten_group

NUM_MICRO = 3
# ZeRO's buckets: the first layer's weight (768 values) gets its own, the rest share one
SHARD_BUCKET_ELEMENTS = 256


def tiny_model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 24), torch.nn.GELU(), torch.nn.Linear(24, 4)).to(
        torch.bfloat16
    )


def flat_groups(model: torch.nn.Module) -> list[list[torch.nn.Parameter]]:
    """ZeRO's parameter groups of the tiny model: its weights, its biases."""
    params = list(model.parameters())
    return [params[0::2], params[1::2]]


def inputs(rank: int, micro: int) -> torch.Tensor:
    return torch.randn(5, 32, generator=torch.Generator().manual_seed(100 * rank + micro))


def loss(model: torch.nn.Module, rank: int, micro: int) -> torch.Tensor:
    return model(inputs(rank, micro).bfloat16()).float().square().mean()


def main(rank: int, world_size: int, port: int, reduce_dtype: str, out: str, mode: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    model = tiny_model()
    params = list(model.parameters())
    micro = {"index": 0}
    if mode == "bucketed":
        masters = [p.detach().float().clone() for p in params]
        reduction = GradientReduction(
            params,
            masters,
            is_last_micro_batch=lambda: micro["index"] == NUM_MICRO - 1,
            data_parallel_group=dist.group.WORLD,
            data_parallel_size=world_size,
            bucket_elements=100,  # several buckets, launched while backward goes on
            reduce_dtype=getattr(torch, reduce_dtype),
        )
    else:
        flats = [
            flatten_group(group, rank=rank, size=world_size, bucket_elements=SHARD_BUCKET_ELEMENTS)
            for group in flat_groups(model)
        ]
        reduction = ShardedGradientReduction(
            [(flat.params, flat.layout) for flat in flats],
            params,
            accumulate_whole=mode == "zero1",
            is_last_micro_batch=lambda: micro["index"] == NUM_MICRO - 1,
            data_parallel_group=dist.group.WORLD,
            data_parallel_size=world_size,
            reduce_dtype=getattr(torch, reduce_dtype),
        )
    steps = []
    for _ in range(2):  # the second step starts from fresh gradients
        for index in range(NUM_MICRO):
            micro["index"] = index
            loss(model, rank, index).backward()
        assert all(p.grad is None for p in params)  # bf16 copies freed as they were added
        if mode == "bucketed":
            reduction.finish()
            steps.append([m.grad.clone() for m in masters])
        else:  # finished at the end of the last backward; with each group's buckets
            partitions = [partition.clone() for partition in reduction.partitions]
            steps.append((partitions, [flat.layout.buckets for flat in flats]))
            reduction.reset()
    torch.save(steps, out)
    # Both ranks done before either closes its connections: a rank that tore its process group
    # down while the other's last all-reduce was still acknowledging aborted now and then
    # ("terminate called without an active exception", exit -6) on a loaded 2-core machine.
    dist.barrier()
    dist.destroy_process_group()
    # With the barrier it still did, once in a CI run (session 8), after the output was saved:
    # in the interpreter's teardown of torch's C++ state, not in the reduction under test. The
    # worker leaves without that teardown; its result is the file saved above.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    mode = sys.argv[6] if len(sys.argv) > 6 else "bucketed"
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], mode)
