"""One rank of the TP=2 vocab-parallel cross-entropy check, started by test_cross_entropy_tp.py.

Usage: python tp_cross_entropy_worker.py RANK WORLD_SIZE INIT_FILE. Every rank builds the same full
logits, keeps its vocab shard, and compares loss and its shard's gradient with F.cross_entropy of
the
full logits, for the kernel and the reference path. Exit 0 and print "ok" when all match.
"""

import os
import sys

if not __import__("torch").cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are defined

import torch
import torch.distributed as dist
import torch.nn.functional as F
from mds_model.kernels import vocab_parallel_cross_entropy


def main() -> int:
    rank, world_size, init_file = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size
    )
    group = dist.new_group(list(range(world_size)))
    # On a GPU machine the kernels need CUDA tensors; gloo all-reduces those too, and two ranks may
    # share the one GPU.
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    failures = []
    for num_rows, vocab_local, dtype in [
        (11, 19, torch.float32),
        (6, 2500, torch.float32),
        (7, 33, torch.bfloat16),
    ]:
        gen = torch.Generator().manual_seed(num_rows * 1000 + vocab_local)
        full = (torch.randn(num_rows, vocab_local * world_size, generator=gen) * 3).to(dtype)
        target = torch.randint(0, vocab_local * world_size, (num_rows,), generator=gen)
        # Put some targets in every shard, including the first and last ids of each.
        target[:world_size] = torch.arange(world_size) * vocab_local
        target[-1] = vocab_local * world_size - 1
        dloss = torch.rand(num_rows, generator=gen)
        full_ref = full.double().requires_grad_()
        expected_loss = F.cross_entropy(full_ref, target, reduction="none")
        (expected_grad,) = torch.autograd.grad(expected_loss, full_ref, dloss.double())
        start = rank * vocab_local
        shard_grad_expected = expected_grad[:, start : start + vocab_local]
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        for use_kernel in (True, False):
            shard = full[:, start : start + vocab_local].to(device).requires_grad_()
            loss = vocab_parallel_cross_entropy(
                shard,
                target.to(device),
                group=group,
                vocab_start_index=start,
                use_kernel=use_kernel,
            )
            (grad,) = torch.autograd.grad(loss, shard, dloss.to(device))
            loss, grad = loss.cpu(), grad.cpu()
            case = (
                f"rank {rank} rows {num_rows} V_local {vocab_local} {dtype} use_kernel={use_kernel}"
            )
            if grad.dtype != dtype:
                failures.append(f"{case}: grad dtype {grad.dtype}")
            if not torch.allclose(loss.double(), expected_loss.detach(), rtol=1e-5, atol=1e-5):
                failures.append(f"{case}: loss {loss.tolist()} != {expected_loss.tolist()}")
            if not torch.allclose(grad.double(), shard_grad_expected, rtol=tol, atol=tol * 0.1):
                err = (grad.double() - shard_grad_expected).abs().max().item()
                failures.append(f"{case}: grad max abs error {err}")
    dist.barrier()  # both ranks done before either closes its connections
    dist.destroy_process_group()
    if failures:
        print("\n".join(failures), file=sys.stderr)
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
