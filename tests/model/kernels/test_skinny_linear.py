"""skinny_linear: the few-row decoding projection (Triton, or the CPU interpreter) against the
pure-torch reference, with and without bias and the fused GeLU, over odd shapes and dtypes."""

import zlib

import pytest
import torch
from mds_model.kernels import bias_gelu, skinny_linear

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("rows", "num_out", "num_in"), [(1, 1, 1), (1, 33, 70), (3, 130, 257), (2, 64, 1100)]
)
@pytest.mark.parametrize(("with_bias", "gelu"), [(True, False), (False, False), (True, True)])
def test_skinny_linear_matches_reference(
    rows, num_out, num_in, with_bias, gelu, dtype, device, assert_close
):
    gen = torch.Generator().manual_seed(zlib.crc32(repr((rows, num_out, num_in)).encode()))
    x = torch.randn(rows, 1, num_in, generator=gen).to(device, dtype)
    weight = (torch.randn(num_out, num_in, generator=gen) / num_in**0.5).to(device, dtype)
    bias = torch.randn(num_out, generator=gen).to(device, dtype) if with_bias else None
    got = skinny_linear(x, weight, bias, gelu=gelu, use_kernel=True)
    want = skinny_linear(x, weight, bias, gelu=gelu, use_kernel=False)
    assert got.shape == (rows, 1, num_out)
    assert_close(got, want, dtype, f"skinny_linear {rows}x{num_in} -> {num_out}")


def test_reference_is_linear_then_megatrons_bias_gelu():
    x, weight, bias = torch.randn(2, 5), torch.randn(3, 5), torch.randn(3)
    torch.testing.assert_close(
        skinny_linear(x, weight, bias, gelu=True, use_kernel=False),
        bias_gelu(x @ weight.t(), bias, use_kernel=False),
    )
