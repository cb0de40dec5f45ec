"""skinny_linear: the few-row decoding projection (Triton, or the CPU interpreter) against the
pure-torch reference, with and without bias and the fused GeLU (tanh or exact), over odd shapes
and dtypes; and
skinny_add_norm_linear (residual add + LayerNorm + the product in one kernel) against the add +
LayerNorm and skinny_linear kernels it replaces; the SwiGLU epilogue over a gated weight's
[gate; up] rows and the RMSNorm mode (Llama's block) against the product, `swiglu` and
`add_rms_norm` they replace; greedy_argmax (the head's greedy pick) against torch.argmax, ties
and the padded columns past the vocabulary included."""

import zlib

import pytest
import torch
from mds_model.kernels import (
    add_layer_norm,
    add_rms_norm,
    bias_gelu,
    skinny_add_norm_linear,
    skinny_linear,
    swiglu,
)
from mds_model.kernels.skinny_linear import ARGMAX_BLOCK, greedy_argmax

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
    ("rows", "num_out", "num_in"),
    [(1, 1, 1), (1, 33, 70), (3, 130, 257), (2, 64, 1100), (1, 40, 2048), (2, 24, 8192)],
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


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "half", "num_in"), [(1, 1, 1), (1, 33, 70), (3, 65, 1100)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_skinny_linear_swiglu_matches_product_then_swiglu(
    rows, half, num_in, with_bias, dtype, device, assert_close
):
    gen = torch.Generator().manual_seed(zlib.crc32(repr((rows, half, num_in, 2)).encode()))
    x = torch.randn(rows, 1, num_in, generator=gen).to(device, dtype)
    weight = (torch.randn(2 * half, num_in, generator=gen) * 2 / num_in**0.5).to(device, dtype)
    bias = torch.randn(2 * half, generator=gen).to(device, dtype) if with_bias else None
    got = skinny_linear(x, weight, bias, swiglu=True, use_kernel=True)
    product = skinny_linear(x, weight, bias, use_kernel=True)
    assert got.shape == (rows, 1, half)
    assert_close(got, swiglu(product, use_kernel=True), dtype, f"skinny swiglu {num_in}->{half}")
    ref = skinny_linear(x, weight, bias, swiglu=True, use_kernel=False)
    assert torch.equal(ref, swiglu(skinny_linear(x, weight, bias, use_kernel=False),
                                   use_kernel=False))  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "num_out", "num_in"), [(1, 2, 8), (1, 66, 70), (2, 130, 2048)])
@pytest.mark.parametrize("swiglu_epilogue", [False, True], ids=["linear", "swiglu"])
def test_skinny_add_rms_norm_linear_matches_add_rms_norm_then_linear(
    rows, num_out, num_in, swiglu_epilogue, dtype, device, assert_close
):
    gen = torch.Generator().manual_seed(zlib.crc32(repr((rows, num_out, num_in, 3)).encode()))
    x, residual = (torch.randn(1, rows, num_in, generator=gen).to(device, dtype) for _ in "xr")
    norm_weight = (1 + 0.1 * torch.randn(num_in, generator=gen)).to(device, dtype)
    weight = (torch.randn(num_out, num_in, generator=gen) / num_in**0.5).to(device, dtype)
    results = {}
    for use_kernel in (True, False):
        fused = skinny_add_norm_linear(
            x,
            residual,
            norm_weight,
            None,
            weight,
            eps=1e-6,
            normalization="rmsnorm",
            swiglu=swiglu_epilogue,
            use_kernel=use_kernel,
        )
        normed, summed = add_rms_norm(
            x, norm_weight, eps=1e-6, residual=residual, use_kernel=use_kernel
        )
        apart = skinny_linear(normed, weight, swiglu=swiglu_epilogue, use_kernel=use_kernel)
        results[use_kernel] = fused, (apart, summed)
    (got, got_summed), (want, summed) = results[True]
    assert torch.equal(got_summed, summed)
    assert got.shape == (1, rows, num_out // 2 if swiglu_epilogue else num_out)
    assert_close(got, want, dtype, f"skinny_add_rms_norm_linear {rows}x{num_in} -> {num_out}")
    # the reference path (CPU decoding) is the composition of the references, bit for bit
    (ref, ref_summed), (want, summed) = results[False]
    assert torch.equal(ref_summed, summed) and torch.equal(ref, want)


def test_the_epilogue_and_the_norm_are_checked():
    x, weight = torch.zeros(1, 8), torch.zeros(3, 8)
    with pytest.raises(ValueError, match="an even count"):
        skinny_linear(x, weight, swiglu=True, use_kernel=False)
    with pytest.raises(ValueError, match="gelu and swiglu are two activations"):
        skinny_linear(x, torch.zeros(4, 8), gelu=True, swiglu=True, use_kernel=False)
    with pytest.raises(ValueError, match="with a norm bias for layernorm only"):
        skinny_add_norm_linear(x, x, x[0], x[0], weight, eps=1e-5, normalization="rmsnorm",
                               use_kernel=False)  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("rows", "width", "num_cols"),
    [(1, 7, 7), (3, 130, 100), (2, ARGMAX_BLOCK, ARGMAX_BLOCK), (2, 5000, 4990)],
)
def test_greedy_argmax_matches_torch_argmax(rows, width, num_cols, dtype, device):
    gen = torch.Generator().manual_seed(zlib.crc32(repr((rows, width, num_cols)).encode()))
    logits = torch.randn(rows, width, generator=gen).to(dtype)
    if width > num_cols:
        logits[0, -1] = 1e4  # a padded column past num_cols is never picked
    if width > 64:  # ties in different chunks and in one chunk: the first index wins
        logits[-1, [num_cols - 1, 3, num_cols // 2]] = 50.0
        logits[0, [10, 11]] = 60.0
    logits = logits.to(device)
    got = greedy_argmax(logits, num_cols=num_cols, use_kernel=True)
    want = logits[:, :num_cols].argmax(dim=-1)
    assert got.dtype == torch.int64 and torch.equal(got.cpu(), want.cpu())
    assert torch.equal(greedy_argmax(logits, num_cols=num_cols, use_kernel=False), want)
    if width > 64:
        assert got[-1].item() == 3 and got[0].item() == 10
    # a view of a wider buffer (the sampler's logits of Megatron's padded vocabulary)
    wide = torch.zeros(rows, width + 9, dtype=dtype, device=device)
    wide[:, :width] = logits
    assert torch.equal(greedy_argmax(wide[:, :width], num_cols=num_cols, use_kernel=True), got)
