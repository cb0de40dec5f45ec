"""bias_gelu: Triton kernel (GPU, or the CPU interpreter) against the pure-torch reference."""

import zlib

import pytest
import torch
import torch.nn.functional as F
from mds_model.kernels import bias_gelu

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _check(shape, dtype, device, assert_close, *, scale=1.0):
    gen = torch.Generator().manual_seed(zlib.crc32(repr((shape, str(dtype))).encode()))
    x = (torch.randn(shape, generator=gen) * scale).to(device, dtype).requires_grad_()
    bias = torch.randn(shape[-1], generator=gen).to(device, dtype).requires_grad_()
    dy = torch.randn(shape, generator=gen).to(device, dtype)
    results = []
    for use_kernel in (True, False):
        y = bias_gelu(x, bias, use_kernel=use_kernel)
        dx, dbias = torch.autograd.grad(y, (x, bias), dy)
        results.append((y, dx, dbias))
    for name, got, want in zip(("y", "dx", "dbias"), *results, strict=False):
        assert_close(got, want, dtype, f"bias_gelu {name} {shape}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (7, 33), (3, 5, 129), (300, 257)])
def test_bias_gelu_matches_reference(shape, dtype, device, assert_close):
    _check(shape, dtype, device, assert_close)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bias_gelu_above_1024_wide(dtype, device, assert_close):
    # GPT-2 XL's hidden size; two rows keep the CPU interpreter to seconds.
    _check((2, 1600), dtype, device, assert_close)


@pytest.mark.filterwarnings(
    "ignore:overflow encountered in exp:RuntimeWarning"
)  # the interpreter's numpy
@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_gelu_saturates_without_overflow(dtype, device, assert_close):
    # |z| up to ~40: the sigmoid form must give z and 0, never inf/NaN, in the forward and backward.
    _check((9, 65), dtype, device, assert_close, scale=15.0)


def test_reference_is_megatron_formula():
    x, bias = torch.randn(4, 10, dtype=torch.float64), torch.randn(10, dtype=torch.float64)
    z = x + bias
    megatron = z * 0.5 * (1.0 + torch.tanh(0.79788456 * z * (1 + 0.044715 * z * z)))
    assert torch.allclose(bias_gelu(x, bias, use_kernel=False), megatron, rtol=1e-7, atol=1e-8)
    assert torch.allclose(
        bias_gelu(x, bias, use_kernel=False), F.gelu(z, approximate="tanh"), atol=1e-7
    )


def test_bias_shape_is_checked():
    with pytest.raises(ValueError, match=r"bias must have shape \(8,\)"):
        bias_gelu(torch.randn(2, 8), torch.randn(7), use_kernel=False)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 1000, 4096), (16 * 1024 + 3, 1000), (2049, 12289)])
def test_bias_gelu_matches_reference_gpu(shape, dtype, device, assert_close):
    _check(shape, dtype, device, assert_close)
