"""bias_gelu: Triton kernel (GPU, or the CPU interpreter) against the pure-torch reference, for
both GeLUs (approximate "tanh": Megatron's fused bias_gelu; "none": the exact erf GeLU of upstream's
unfused F.gelu), and the references against Megatron's formulas and torch's F.gelu."""

import zlib

import pytest
import torch
import torch.nn.functional as F
from mds_model.kernels import bias_gelu

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


APPROXIMATIONS = ["tanh", "none"]


def _check(shape, dtype, device, assert_close, *, approximate, scale=1.0):
    gen = torch.Generator().manual_seed(zlib.crc32(repr((shape, str(dtype))).encode()))
    x = (torch.randn(shape, generator=gen) * scale).to(device, dtype).requires_grad_()
    bias = torch.randn(shape[-1], generator=gen).to(device, dtype).requires_grad_()
    dy = torch.randn(shape, generator=gen).to(device, dtype)
    results = []
    for use_kernel in (True, False):
        y = bias_gelu(x, bias, approximate=approximate, use_kernel=use_kernel)
        dx, dbias = torch.autograd.grad(y, (x, bias), dy)
        results.append((y, dx, dbias))
    for name, got, want in zip(("y", "dx", "dbias"), *results, strict=False):
        assert_close(got, want, dtype, f"bias_gelu({approximate}) {name} {shape}")


@pytest.mark.parametrize("approximate", APPROXIMATIONS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (7, 33), (3, 5, 129), (300, 257)])
def test_bias_gelu_matches_reference(shape, dtype, approximate, device, assert_close):
    _check(shape, dtype, device, assert_close, approximate=approximate)


@pytest.mark.parametrize("approximate", APPROXIMATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bias_gelu_above_1024_wide(dtype, approximate, device, assert_close):
    # GPT-2 XL's hidden size; two rows keep the CPU interpreter to seconds.
    _check((2, 1600), dtype, device, assert_close, approximate=approximate)


@pytest.mark.filterwarnings(
    "ignore:overflow encountered in exp:RuntimeWarning"
)  # the interpreter's numpy
@pytest.mark.parametrize("approximate", APPROXIMATIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_gelu_saturates_without_overflow(dtype, approximate, device, assert_close):
    # |z| up to ~40: the sigmoid form (and erf with exp(-z^2/2)) must give z and 0, never inf/NaN,
    # in the forward and backward.
    _check((9, 65), dtype, device, assert_close, approximate=approximate, scale=15.0)


def test_reference_is_megatron_formula():
    x, bias = torch.randn(4, 10, dtype=torch.float64), torch.randn(10, dtype=torch.float64)
    z = x + bias
    megatron = z * 0.5 * (1.0 + torch.tanh(0.79788456 * z * (1 + 0.044715 * z * z)))
    assert torch.allclose(bias_gelu(x, bias, use_kernel=False), megatron, rtol=1e-7, atol=1e-8)
    assert torch.allclose(
        bias_gelu(x, bias, use_kernel=False), F.gelu(z, approximate="tanh"), atol=1e-7
    )


def test_exact_reference_is_upstream_s_unfused_gelu():
    """--no-bias-gelu-fusion: upstream's ParallelMLP computes F.gelu(x + bias) (torch's default,
    the erf GeLU); --onnx-safe: megatron/model/utils.py's erf_gelu, whose 1.41421 for sqrt(2) moves
    it by at most ~1e-6 from it."""
    x, bias = torch.randn(64, 100, dtype=torch.float64) * 3, torch.randn(100, dtype=torch.float64)
    z = x + bias
    exact = bias_gelu(x, bias, approximate="none", use_kernel=False)
    torch.testing.assert_close(exact, F.gelu(z, approximate="none"), rtol=0, atol=1e-15)
    torch.testing.assert_close(exact, 0.5 * z * (1 + torch.erf(z / 2**0.5)), rtol=0, atol=1e-15)
    erf_gelu = z * 0.5 * (torch.erf(z / 1.41421) + torch.ones_like(z))
    torch.testing.assert_close(exact, erf_gelu, rtol=0, atol=2e-6)
    # ...and the tanh form is another function: up to ~5e-4 apart.
    tanh = bias_gelu(x, bias, approximate="tanh", use_kernel=False)
    assert (exact - tanh).abs().max() > 1e-4


def test_approximate_is_checked():
    with pytest.raises(ValueError, match="approximate must be one of tanh, none; got 'erf'"):
        bias_gelu(torch.randn(2, 8), torch.randn(8), approximate="erf", use_kernel=False)


def test_bias_shape_is_checked():
    with pytest.raises(ValueError, match=r"bias must have shape \(8,\)"):
        bias_gelu(torch.randn(2, 8), torch.randn(7), use_kernel=False)


@pytest.mark.gpu
@pytest.mark.parametrize("approximate", APPROXIMATIONS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 1000, 4096), (16 * 1024 + 3, 1000), (2049, 12289)])
def test_bias_gelu_matches_reference_gpu(shape, dtype, approximate, device, assert_close):
    _check(shape, dtype, device, assert_close, approximate=approximate)
