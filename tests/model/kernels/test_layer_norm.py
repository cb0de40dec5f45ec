"""add_layer_norm: Triton kernel (GPU, or the CPU interpreter) against the pure-torch reference."""

import zlib

import pytest
import torch
import torch.nn.functional as F
from mds_model.kernels import add_layer_norm

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _check(shape, dtype, device, assert_close, *, with_residual, grad_into_summed, eps=1e-5):
    gen = torch.Generator().manual_seed(
        zlib.crc32(repr((shape, str(dtype), with_residual)).encode())
    )
    hidden = shape[-1]

    def make(*size, scale=1.0, offset=0.0):
        return (
            (torch.randn(size, generator=gen) * scale + offset).to(device, dtype).requires_grad_()
        )

    # Rows with a non-zero mean and large spread exercise the fp32 statistics.
    x = make(*shape, scale=2.0, offset=3.0)
    residual = make(*shape) if with_residual else None
    weight, bias = make(hidden, offset=1.0), make(hidden)
    dnormed = torch.randn(shape, generator=gen).to(device, dtype)
    dsummed = torch.randn(shape, generator=gen).to(device, dtype)
    inputs = [t for t in (x, residual, weight, bias) if t is not None]
    results = []
    for use_kernel in (True, False):
        normed, summed = add_layer_norm(
            x, weight, bias, eps=eps, residual=residual, use_kernel=use_kernel
        )
        outputs, grads = [normed], [dnormed]
        if grad_into_summed:
            outputs.append(summed)
            grads.append(dsummed)
        results.append((normed, summed, *torch.autograd.grad(outputs, inputs, grads)))
    names = (
        ["normed", "summed", "dx"] + (["dresidual"] if with_residual else []) + ["dweight", "dbias"]
    )
    for name, got, want in zip(names, *results, strict=False):
        assert_close(got, want, dtype, f"add_layer_norm {name} {shape}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 3), (5, 7), (3, 13, 129), (37, 1000)])
@pytest.mark.parametrize("with_residual", [True, False])
def test_add_layer_norm_matches_reference(shape, dtype, with_residual, device, assert_close):
    _check(
        shape,
        dtype,
        device,
        assert_close,
        with_residual=with_residual,
        grad_into_summed=with_residual,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden", [1600, 2048])  # GPT-2 XL's, and a power of two above 1024
def test_add_layer_norm_at_real_hidden_sizes(hidden, dtype, device, assert_close):
    _check((3, hidden), dtype, device, assert_close, with_residual=True, grad_into_summed=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(5, 7), (37, 1000)])
def test_without_residual_the_passed_on_x_takes_gradient_too(shape, dtype, device, assert_close):
    # A block's x goes into the LayerNorm and on as its residual: the kernel adds the two
    # gradients in its backward; the reference leaves the sum to autograd.
    _check(shape, dtype, device, assert_close, with_residual=False, grad_into_summed=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_layer_norm_only_normed_used(dtype, device, assert_close):
    # summed returned but unused: its gradient is None and must be treated as zero.
    _check((6, 96), dtype, device, assert_close, with_residual=True, grad_into_summed=False)


def test_reference_matches_torch_layer_norm():
    x, r = torch.randn(4, 9, 24, dtype=torch.float64), torch.randn(4, 9, 24, dtype=torch.float64)
    w, b = torch.randn(24, dtype=torch.float64), torch.randn(24, dtype=torch.float64)
    normed, summed = add_layer_norm(x, w, b, eps=1e-5, residual=r, use_kernel=False)
    assert torch.equal(summed, x + r)
    assert torch.allclose(
        normed, F.layer_norm(x + r, (24,), w, b, 1e-5).to(normed.dtype), atol=1e-5
    )


@pytest.mark.parametrize("use_kernel", [True, False])
def test_hidden_size_one_gives_bias(use_kernel, device):
    # Variance 0: every row normalises to 0, so normed is the bias and dx is 0.
    x = torch.randn(5, 1, device=device, requires_grad=True)
    weight, bias = torch.full((1,), 2.0, device=device), torch.full((1,), 0.5, device=device)
    normed, _ = add_layer_norm(x, weight, bias, eps=1e-5, use_kernel=use_kernel)
    assert torch.equal(normed, torch.full((5, 1), 0.5, device=device))
    (dx,) = torch.autograd.grad(normed.sum(), x)
    assert dx.abs().max() < 1e-3


def test_without_residual_summed_is_x(device):
    x = torch.randn(3, 16, device=device)
    _, summed = add_layer_norm(
        x, torch.ones(16, device=device), torch.zeros(16, device=device), eps=1e-5, use_kernel=True
    )
    assert summed.data_ptr() == x.data_ptr() and torch.equal(summed, x)  # a view: no copy


def test_shapes_are_checked():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match=r"weight and bias must have shape \(8,\)"):
        add_layer_norm(x, torch.ones(7), torch.zeros(8), eps=1e-5, use_kernel=False)
    with pytest.raises(ValueError, match="residual must match x"):
        add_layer_norm(
            x, torch.ones(8), torch.zeros(8), eps=1e-5, residual=x.half(), use_kernel=False
        )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape", [(8, 1024, 1024), (16 * 1024 + 5, 1000), (4099, 4097), (513, 12288)]
)
def test_add_layer_norm_matches_reference_gpu(shape, dtype, device, assert_close):
    _check(shape, dtype, device, assert_close, with_residual=True, grad_into_summed=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(8, 1024, 1024), (4099, 2048)])
def test_without_residual_the_passed_on_x_takes_gradient_too_gpu(
    shape, dtype, device, assert_close
):
    _check(shape, dtype, device, assert_close, with_residual=False, grad_into_summed=True)
