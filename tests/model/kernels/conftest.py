"""Kernel tests run the real Triton kernels: on a CUDA GPU when there is one, else through Triton's
CPU interpreter. TRITON_INTERPRET must be set before any kernel module is imported (triton.jit reads
it when the kernels are defined); tests/conftest.py sets it, and this one too when run alone.
"""

import os
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Per-dtype tolerance on ||kernel - reference|| / ||reference||: both compute in fp32, so the gap
# is the rounding of outputs (and summation order) in the storage dtype.
REL_TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.fixture(scope="session")
def device() -> torch.device:
    if "mds_model.kernels.bias_gelu" in sys.modules and not torch.cuda.is_available():
        module = sys.modules["mds_model.kernels.bias_gelu"]
        if type(module._bias_gelu_fwd).__name__ != "InterpretedFunction":
            pytest.fail(
                "mds_model.kernels was imported before TRITON_INTERPRET=1 was set; "
                "set TRITON_INTERPRET=1 in the environment (or a higher conftest)"
            )
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _assert_close(
    actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str
) -> None:
    assert actual.shape == expected.shape, (
        f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    )
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    a, e = actual.double(), expected.double()
    assert torch.isfinite(a).all(), f"{what}: non-finite values in the kernel's result"
    scale = e.norm().item()
    err = (a - e).norm().item()
    # The small absolute floor covers results that are rounding noise themselves (e.g. LayerNorm's
    # dweight over a hidden size of 1, where xhat is 0 up to rounding).
    floor = 1e-5 * e.numel() ** 0.5
    assert err <= REL_TOL[dtype] * scale + floor, (
        f"{what} ({dtype}): relative error {err / max(scale, 1e-30):.3g} > {REL_TOL[dtype]}"
    )


@pytest.fixture(scope="session")
def assert_close():
    """assert_close(kernel_result, reference_result, dtype, what): relative-norm check per dtype."""
    return _assert_close
