"""GradientReduction (fp32 accumulation and bucketed, overlapped data-parallel averaging) against
gradients summed and averaged by hand, in a 2-process gloo run (grad_sync_worker.py)."""

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


@pytest.mark.parametrize("reduce_dtype", ["float32", "bfloat16"])
def test_gradients_are_fp32_sums_averaged_over_ranks(runs, tmp_path, reduce_dtype):
    """fp32 on the wire matches to rounding; bf16 (--grad-reduce-in-bf16) to bf16's precision."""
    world_size, port = 2, runs._free_port()
    outputs = [tmp_path / f"rank{rank}.pt" for rank in range(world_size)]
    processes = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(rank), str(world_size), str(port), reduce_dtype]
            + [str(outputs[rank])],
            env=runs._environment(),
        )
        for rank in range(world_size)
    ]
    assert [process.wait(timeout=120) for process in processes] == [0] * world_size
    expected = _expected_gradients(_worker_module(), world_size)
    tolerance = 1e-6 if reduce_dtype == "float32" else 2e-2
    for output in outputs:
        for step in torch.load(output):
            for got, want in zip(step, expected, strict=True):
                torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)
