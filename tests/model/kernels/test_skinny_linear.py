"""skinny_linear: the few-row decoding projection (Triton, or the CPU interpreter) against the
pure-torch reference, with and without bias and the fused GeLU (tanh or exact), over odd shapes
and dtypes; and
skinny_add_norm_linear (residual add + LayerNorm + the product in one kernel) against the add +
LayerNorm and skinny_linear kernels it replaces."""

import zlib

import pytest
import torch
from mds_model.kernels import add_layer_norm, bias_gelu, skinny_add_norm_linear, skinny_linear

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# (bias, GeLU, its approximate): no epilogue, bias only, bias + tanh GeLU, bias + exact GeLU.
EPILOGUES = [
    (True, False, "tanh"),
    (False, False, "tanh"),
    (True, True, "tanh"),
    (True, True, "none"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("rows", "num_out", "num_in"), [(1, 1, 1), (1, 33, 70), (3, 130, 257), (2, 64, 1100)]
)
@pytest.mark.parametrize(("with_bias", "gelu", "approximate"), EPILOGUES)
def test_skinny_linear_matches_reference(
    rows, num_out, num_in, with_bias, gelu, approximate, dtype, device, assert_close
):
    gen = torch.Generator().manual_seed(zlib.crc32(repr((rows, num_out, num_in)).encode()))
    x = torch.randn(rows, 1, num_in, generator=gen).to(device, dtype)
    weight = (torch.randn(num_out, num_in, generator=gen) / num_in**0.5).to(device, dtype)
    bias = torch.randn(num_out, generator=gen).to(device, dtype) if with_bias else None
    got = skinny_linear(x, weight, bias, gelu=gelu, approximate=approximate, use_kernel=True)
    want = skinny_linear(x, weight, bias, gelu=gelu, approximate=approximate, use_kernel=False)
    assert got.shape == (rows, 1, num_out)
    assert_close(got, want, dtype, f"skinny_linear {rows}x{num_in} -> {num_out}")


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_reference_is_linear_then_bias_gelu(approximate):
    x, weight, bias = torch.randn(2, 5), torch.randn(3, 5), torch.randn(3)
    torch.testing.assert_close(
        skinny_linear(x, weight, bias, gelu=True, approximate=approximate, use_kernel=False),
        bias_gelu(x @ weight.t(), bias, approximate=approximate, use_kernel=False),
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "num_out", "num_in"), [(1, 1, 8), (1, 33, 70), (2, 130, 1024)])
@pytest.mark.parametrize(("with_bias", "gelu", "approximate"), EPILOGUES)
def test_skinny_add_norm_linear_matches_add_norm_then_linear(
    rows, num_out, num_in, with_bias, gelu, approximate, dtype, device, assert_close
):
    gen = torch.Generator().manual_seed(zlib.crc32(repr((rows, num_out, num_in, 1)).encode()))
    x, residual = (torch.randn(1, rows, num_in, generator=gen).to(device, dtype) for _ in "xr")
    norm_weight = (1 + 0.1 * torch.randn(num_in, generator=gen)).to(device, dtype)
    norm_bias = (0.1 * torch.randn(num_in, generator=gen)).to(device, dtype)
    weight = (torch.randn(num_out, num_in, generator=gen) / num_in**0.5).to(device, dtype)
    bias = torch.randn(num_out, generator=gen).to(device, dtype) if with_bias else None
    got, got_summed = skinny_add_norm_linear(
        x,
        residual,
        norm_weight,
        norm_bias,
        weight,
        bias,
        eps=1e-5,
        gelu=gelu,
        approximate=approximate,
        use_kernel=True,
    )
    normed, summed = add_layer_norm(
        x, norm_weight, norm_bias, eps=1e-5, residual=residual, use_kernel=True
    )
    want = skinny_linear(normed, weight, bias, gelu=gelu, approximate=approximate, use_kernel=True)
    assert torch.equal(got_summed, summed)  # the same rounded sum, the next residual
    assert got.shape == (1, rows, num_out)
    assert_close(got, want, dtype, f"skinny_add_norm_linear {rows}x{num_in} -> {num_out}")
    # The reference path (CPU decoding) is the same composition of the references.
    ref, ref_summed = skinny_add_norm_linear(
        x,
        residual,
        norm_weight,
        norm_bias,
        weight,
        bias,
        eps=1e-5,
        gelu=gelu,
        approximate=approximate,
        use_kernel=False,
    )
    normed, summed = add_layer_norm(
        x, norm_weight, norm_bias, eps=1e-5, residual=residual, use_kernel=False
    )
    assert torch.equal(ref_summed, summed)
    assert torch.equal(
        ref,
        skinny_linear(normed, weight, bias, gelu=gelu, approximate=approximate, use_kernel=False),
    )


def test_skinny_add_norm_linear_refuses_rows_wider_than_one_program(device):
    x = torch.zeros(1, 4096, device=device)
    weight = torch.zeros(8, 4096, device=device)
    with pytest.raises(ValueError, match="at most 2048 columns"):
        skinny_add_norm_linear(x, x, x[0], x[0], weight, eps=1e-5, use_kernel=True)
