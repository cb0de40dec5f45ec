"""GradientReduction (fp32 accumulation and bucketed, overlapped data-parallel averaging) and
ZeRO-1/2's ShardedGradientReduction (reduce-scattered into each rank's slices) against gradients
summed and averaged by hand, in a 2-process gloo run (grad_sync_worker.py)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.multiprocess

WORKER = Path(__file__).with_name("grad_sync_worker.py")


def _worker_module():
    spec = importlib.util.spec_from_file_location("grad_sync_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _expected_gradients(worker, world_size: int) -> list[torch.Tensor]:
    """Per parameter: the mean over ranks of the fp32 sum over micro-batches of bf16 gradients."""
    model = worker.tiny_model()
    total = [torch.zeros(p.shape) for p in model.parameters()]
    for rank in range(world_size):
        for micro in range(worker.NUM_MICRO):
            model.zero_grad()
            worker.loss(model, rank, micro).backward()
            for acc, param in zip(total, model.parameters(), strict=True):
                acc += param.grad.float()
    return [acc / world_size for acc in total]


def _run_workers(runs, tmp_path, reduce_dtype: str, mode: str, world_size: int) -> list[Path]:
    port = runs._free_port()
    outputs = [tmp_path / f"rank{rank}.pt" for rank in range(world_size)]
    processes = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(rank), str(world_size), str(port), reduce_dtype]
            + [str(outputs[rank]), mode],
            env=runs._environment(),
        )
        for rank in range(world_size)
    ]
    assert [process.wait(timeout=120) for process in processes] == [0] * world_size
    return outputs


def _tolerance(reduce_dtype: str) -> float:
    return 1e-6 if reduce_dtype == "float32" else 2e-2


@pytest.mark.parametrize("reduce_dtype", ["float32", "bfloat16"])
def test_gradients_are_fp32_sums_averaged_over_ranks(runs, tmp_path, reduce_dtype):
    """fp32 on the wire matches to rounding; bf16 (--grad-reduce-in-bf16) to bf16's precision."""
    world_size = 2
    outputs = _run_workers(runs, tmp_path, reduce_dtype, "bucketed", world_size)
    expected = _expected_gradients(_worker_module(), world_size)
    tolerance = _tolerance(reduce_dtype)
    for output in outputs:
        for step in torch.load(output):
            for got, want in zip(step, expected, strict=True):
                torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize(
    ("mode", "reduce_dtype"), [("zero1", "float32"), ("zero2", "float32"), ("zero2", "bfloat16")]
)
def test_each_rank_keeps_its_slice_of_every_bucket(runs, tmp_path, mode, reduce_dtype):
    """Each flat group (the weights, the biases: end to end, padded to a multiple of 2 x DP) is
    cut into buckets (the layout's, saved beside the gradients); rank r's partition gradient is
    the r-th half of each bucket of the averaged gradients, the halves end to end."""
    world_size = 2
    worker = _worker_module()
    outputs = _run_workers(runs, tmp_path, reduce_dtype, mode, world_size)
    expected = _expected_gradients(worker, world_size)
    model = worker.tiny_model()
    index = {id(p): i for i, p in enumerate(model.parameters())}
    wholes = []
    for group in worker.flat_groups(model):
        whole = torch.cat([expected[index[id(p)]].reshape(-1) for p in group])
        length = -(-whole.numel() // (2 * world_size)) * 2 * world_size
        wholes.append(torch.nn.functional.pad(whole, (0, length - whole.numel())))
    tolerance = _tolerance(reduce_dtype)
    for rank, output in enumerate(outputs):
        for partitions, buckets in torch.load(output):
            assert len(buckets[0]) == 2  # the first weight in a bucket of its own
            for got, whole, cuts in zip(partitions, wholes, buckets, strict=True):
                assert [start for start, _ in cuts] == [0] + [s + n for s, n in cuts[:-1]]
                assert sum(n for _, n in cuts) == whole.numel()
                halves = [
                    whole.narrow(0, start + rank * (numel // world_size), numel // world_size)
                    for start, numel in cuts
                ]
                torch.testing.assert_close(got, torch.cat(halves), rtol=tolerance, atol=tolerance)
