"""GradientReduction (fp32 accumulation and bucketed, overlapped data-parallel averaging) against
gradients summed and averaged by hand, in a 2-process gloo run."""

import multiprocessing
import os

import pytest
import torch
import torch.distributed as dist
from mds_train.grad_sync import GradientReduction

NUM_MICRO = 3


def _model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to(
        torch.bfloat16
    )


def _inputs(rank: int, micro: int) -> torch.Tensor:
    return torch.randn(5, 8, generator=torch.Generator().manual_seed(100 * rank + micro))


def _expected_gradients(world_size: int) -> list[torch.Tensor]:
    """Per-parameter mean over ranks of the fp32 sum over micro-batches of bf16 gradients."""
    model = _model()
    total = [torch.zeros(p.shape) for p in model.parameters()]
    for rank in range(world_size):
        for micro in range(NUM_MICRO):
            model.zero_grad()
            model(_inputs(rank, micro).bfloat16()).float().square().mean().backward()
            for acc, param in zip(total, model.parameters(), strict=True):
                acc += param.grad.float()
    return [acc / world_size for acc in total]


def _worker(rank: int, world_size: int, port: int, reduce_dtype, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    model = _model()
    params = list(model.parameters())
    masters = [p.detach().float().clone() for p in params]
    micro = {"index": 0}
    reduction = GradientReduction(
        params,
        masters,
        is_last_micro_batch=lambda: micro["index"] == NUM_MICRO - 1,
        data_parallel_group=dist.group.WORLD,
        data_parallel_size=world_size,
        bucket_elements=100,  # several buckets, launched while backward goes on
        reduce_dtype=reduce_dtype,
    )
    results = []
    for _ in range(2):  # a second step starts from fresh gradients
        for index in range(NUM_MICRO):
            micro["index"] = index
            model(_inputs(rank, index).bfloat16()).float().square().mean().backward()
        reduction.finish()
        assert all(p.grad is None for p in params)  # bf16 copies freed as they were added
        results.append([m.grad.numpy().copy() for m in masters])  # plain pickles
    queue.put((rank, results))
    dist.destroy_process_group()


@pytest.mark.parametrize("reduce_dtype", [torch.float32, torch.bfloat16])
def test_gradients_are_fp32_sums_averaged_over_ranks(runs, reduce_dtype):
    """fp32 on the wire matches to rounding; bf16 (--grad-reduce-in-bf16) to bf16's precision."""
    free_port = runs._free_port()
    world_size = 2
    context = multiprocessing.get_context(
        "fork"
    )  # CPU only: nothing to re-initialize in the children
    queue = context.Queue()
    processes = [
        context.Process(target=_worker, args=(rank, world_size, free_port, reduce_dtype, queue))
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    results = dict(queue.get(timeout=100) for _ in processes)
    for process in processes:
        process.join(timeout=30)
        assert process.exitcode == 0
    expected = _expected_gradients(world_size)
    for rank in range(world_size):
        for step in results[rank]:
            for got, want in zip(step, expected, strict=True):
                tolerance = 1e-6 if reduce_dtype == torch.float32 else 1e-2
                torch.testing.assert_close(
                    torch.from_numpy(got), want, rtol=tolerance, atol=tolerance
                )
