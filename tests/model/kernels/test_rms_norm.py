"""add_rms_norm: Triton kernel (GPU, or the CPU interpreter) against the pure-torch reference, and
the reference against transformers' LlamaRMSNorm and Megatron-DeepSpeed's RMSNorm formula."""

import zlib

import pytest
import torch
from mds_model.kernels import add_rms_norm
from transformers.models.llama.modeling_llama import LlamaRMSNorm

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

    # A non-zero mean and a large spread: RMSNorm does not centre, so the mean enters the scale.
    x = make(*shape, scale=2.0, offset=3.0)
    residual = make(*shape) if with_residual else None
    weight = make(hidden, offset=1.0)
    dnormed = torch.randn(shape, generator=gen).to(device, dtype)
    dsummed = torch.randn(shape, generator=gen).to(device, dtype)
    inputs = [t for t in (x, residual, weight) if t is not None]
    results = []
    for use_kernel in (True, False):
        normed, summed = add_rms_norm(x, weight, eps=eps, residual=residual, use_kernel=use_kernel)
        outputs, grads = [normed], [dnormed]
        if grad_into_summed:
            outputs.append(summed)
            grads.append(dsummed)
        results.append((normed, summed, *torch.autograd.grad(outputs, inputs, grads)))
    names = ["normed", "summed", "dx"] + (["dresidual"] if with_residual else []) + ["dweight"]
    for name, got, want in zip(names, *results, strict=True):
        assert_close(got, want, dtype, f"add_rms_norm {name} {shape}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 3), (5, 7), (3, 13, 129), (37, 1000), (3, 4097)])
@pytest.mark.parametrize("with_residual", [True, False])
def test_add_rms_norm_matches_reference(shape, dtype, with_residual, device, assert_close):
    _check(
        shape,
        dtype,
        device,
        assert_close,
        with_residual=with_residual,
        grad_into_summed=with_residual,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(5, 7), (37, 1000)])
def test_without_residual_the_passed_on_x_takes_gradient_too(shape, dtype, device, assert_close):
    # A block's x goes into the norm and on as its residual: the kernel adds the two gradients in
    # its backward; the reference leaves the sum to autograd.
    _check(shape, dtype, device, assert_close, with_residual=False, grad_into_summed=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_rms_norm_only_normed_used(dtype, device, assert_close):
    # summed returned but unused: its gradient is None and must be treated as zero.
    _check((6, 96), dtype, device, assert_close, with_residual=True, grad_into_summed=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_rms_norm_at_a_real_hidden_size(dtype, device, assert_close):
    # 2048 > 1024 takes more warps per row and one row per backward tile.
    _check((3, 2048), dtype, device, assert_close, with_residual=True, grad_into_summed=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("eps", [1e-5, 1e-6])  # upstream's default, and LlamaConfig's
def test_reference_is_llama_rms_norm_bit_for_bit(dtype, eps):
    """The reference computes LlamaRMSNorm's operations in its order (fp32 statistics, the row
    rounded to the input dtype, then weighted), so it returns its bits in every dtype, and its
    gradients too; the residual add is the plain sum in the storage dtype."""
    gen = torch.Generator().manual_seed(7)
    x = (torch.randn(4, 9, 130, generator=gen) * 2 + 1).to(dtype).requires_grad_()
    residual = torch.randn(4, 9, 130, generator=gen).to(dtype).requires_grad_()
    llama = LlamaRMSNorm(130, eps=eps).to(dtype)
    with torch.no_grad():
        llama.weight.copy_(torch.randn(130, generator=gen) + 1)
    weight = llama.weight.detach().clone().requires_grad_()
    normed, summed = add_rms_norm(x, weight, eps=eps, residual=residual, use_kernel=False)
    want = llama(x + residual)
    assert torch.equal(summed, x + residual)
    assert normed.dtype == want.dtype == dtype
    assert torch.equal(normed, want)
    dy = torch.randn(normed.shape, generator=gen).to(dtype)
    got_grads = torch.autograd.grad(normed, (x, residual, weight), dy)
    want_grads = torch.autograd.grad(want, (x, residual, llama.weight), dy)
    for got, expected in zip(got_grads, want_grads, strict=True):
        assert torch.equal(got, expected)


def test_reference_is_megatron_deepspeed_rms_norm():
    """megatron/model/rmsnorm.py: `self._norm(x.float()).type_as(x) * self.weight`,
    _norm(x) = x * rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)."""
    x = torch.randn(6, 64, dtype=torch.bfloat16) * 3
    weight = (torch.randn(64) + 1).to(torch.bfloat16)
    xf = x.float()
    upstream = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * weight
    normed, summed = add_rms_norm(x, weight, eps=1e-5, use_kernel=False)
    assert summed is x
    assert torch.equal(normed, upstream)


@pytest.mark.parametrize("use_kernel", [True, False])
def test_hidden_size_one_gives_sign_times_weight(use_kernel, device):
    # One element per row: s * rsqrt(s^2 + eps) is sign(s) up to eps, and its gradient ~0.
    x = torch.tensor([[3.0], [-2.0], [0.5]], device=device, requires_grad=True)
    weight = torch.full((1,), 2.0, device=device)
    normed, _ = add_rms_norm(x, weight, eps=1e-6, use_kernel=use_kernel)
    torch.testing.assert_close(normed, torch.tensor([[2.0], [-2.0], [2.0]], device=device))
    (dx,) = torch.autograd.grad(normed.sum(), x)
    assert dx.abs().max() < 1e-4


def test_without_residual_summed_is_x(device):
    x = torch.randn(3, 16, device=device)
    _, summed = add_rms_norm(x, torch.ones(16, device=device), eps=1e-5, use_kernel=True)
    assert summed.data_ptr() == x.data_ptr() and torch.equal(summed, x)  # a view: no copy


def test_shapes_are_checked():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match=r"weight must have shape \(8,\)"):
        add_rms_norm(x, torch.ones(7), eps=1e-5, use_kernel=False)
    with pytest.raises(ValueError, match="residual must match x"):
        add_rms_norm(x, torch.ones(8), eps=1e-5, residual=x.half(), use_kernel=False)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(16 * 1024, 4096), (4, 1000, 5120), (4099, 4097), (513, 8192)])
def test_add_rms_norm_matches_reference_gpu(shape, dtype, device, assert_close):
    _check(shape, dtype, device, assert_close, with_residual=True, grad_into_summed=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(16 * 1024, 4096), (4099, 2048)])
def test_without_residual_the_passed_on_x_takes_gradient_too_gpu(
    shape, dtype, device, assert_close
):
    _check(shape, dtype, device, assert_close, with_residual=False, grad_into_summed=True)
