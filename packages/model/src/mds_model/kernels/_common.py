"""Shared launcher helpers for the Triton kernels: import guard, row flattening and warp sizing.

Triton is imported lazily so that the pure-torch references (the CPU path) work without it.
"""

import os

import torch


def triton_available() -> bool:
    """True when Triton can run here: a CUDA device, or the CPU interpreter (TRITON_INTERPRET=1)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


def check_kernel_device(*tensors: torch.Tensor, name: str) -> None:
    """Fail with a clear message instead of a Triton pointer error when the kernel cannot run."""
    try:
        import triton  # noqa: F401
    except ImportError:
        raise ValueError(
            f"{name}: use_kernel=True needs Triton; install it or pass use_kernel=False"
        ) from None
    interpreting = os.environ.get("TRITON_INTERPRET") == "1"
    for tensor in tensors:
        if tensor.device.type != "cuda" and not interpreting:
            raise ValueError(
                f"{name}: use_kernel=True needs CUDA tensors (got {tensor.device}); "
                "pass use_kernel=False for the pure-torch path, or set TRITON_INTERPRET=1"
            )


def num_warps_for(block: int, *, elem_per_thread: int = 8) -> int:
    """Enough warps that each thread holds about `elem_per_thread` elements of a block, 1..16."""
    warps = max(1, block // (32 * elem_per_thread))
    return min(16, 1 << (warps.bit_length() - 1))


def as_rows(tensor: torch.Tensor) -> torch.Tensor:
    """View a tensor as (rows, last_dim) with a unit inner stride (copies only when it must)."""
    rows = tensor.reshape(-1, tensor.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    return rows
