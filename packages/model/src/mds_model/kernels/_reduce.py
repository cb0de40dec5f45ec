"""Second stage of the two-stage column reductions (dbias, dweight): sum fp32 partial rows.

The backward kernels write one fp32 partial row per program (Triton tutorial / Liger-Kernel
pattern); this sums them and casts to the parameter dtype in one launch instead of torch's sum and
cast.
"""

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs never reach the kernels
    triton = None

if triton is not None:

    @triton.jit
    def _sum_partials_kernel(
        partial_ptr,
        out_ptr,
        num_partials,
        num_cols,
        BLOCK_P: tl.constexpr,
        BLOCK_C: tl.constexpr,
    ):
        cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
        col_ok = cols < num_cols
        # A 2-D accumulator: the cross-row reduction happens once, after the loop.
        acc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
        for start in range(0, num_partials, BLOCK_P):
            rows = (start + tl.arange(0, BLOCK_P)).to(tl.int64)
            mask = (rows < num_partials)[:, None] & col_ok[None, :]
            acc += tl.load(
                partial_ptr + rows[:, None] * num_cols + cols[None, :], mask=mask, other=0.0
            )
        tl.store(out_ptr + cols, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=col_ok)


# 32 fp32 columns = one 128-byte line per partial row; narrow blocks give enough programs to keep
# the chip busy even for a few thousand columns.
_BLOCK_P, _BLOCK_C = 64, 32


def sum_partials(partial: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Column sums of a contiguous fp32 (P, C) tensor, accumulated in fp32, returned as (C,)
    `dtype`."""
    num_partials, num_cols = partial.shape
    out = torch.empty(num_cols, dtype=dtype, device=partial.device)
    _sum_partials_kernel[(triton.cdiv(num_cols, _BLOCK_C),)](
        partial,
        out,
        num_partials,
        num_cols,
        BLOCK_P=_BLOCK_P,
        BLOCK_C=_BLOCK_C,
        num_warps=4,
    )
    return out
