"""vocab_parallel_cross_entropy on one rank: Triton kernel against the reference and
F.cross_entropy."""

import zlib

import pytest
import torch
import torch.nn.functional as F
from mds_model.kernels import vocab_parallel_cross_entropy

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _check(num_rows, vocab, dtype, device, assert_close):
    gen = torch.Generator().manual_seed(zlib.crc32(repr((num_rows, vocab, str(dtype))).encode()))
    logits = (torch.randn(num_rows, vocab, generator=gen) * 4).to(device, dtype).requires_grad_()
    target = torch.randint(0, vocab, (num_rows,), generator=gen).to(device)
    dloss = torch.rand(num_rows, generator=gen).to(device)
    results = []
    for use_kernel in (True, False):
        loss = vocab_parallel_cross_entropy(logits, target, use_kernel=use_kernel)
        assert loss.dtype == torch.float32
        results.append((loss, *torch.autograd.grad(loss, logits, dloss)))
    assert_close(
        results[0][0],
        results[1][0],
        torch.float32,
        f"cross_entropy loss ({num_rows}, {vocab}) {dtype}",
    )
    assert_close(
        results[0][1], results[1][1], dtype, f"cross_entropy dlogits ({num_rows}, {vocab})"
    )
    expected = F.cross_entropy(logits.detach().double(), target, reduction="none").float()
    assert torch.allclose(results[0][0], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_rows,vocab", [(1, 1), (13, 7), (5, 1000), (3, 5000)])
def test_cross_entropy_matches_reference(num_rows, vocab, dtype, device, assert_close):
    _check(num_rows, vocab, dtype, device, assert_close)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_entropy_at_gpt2_padded_vocabulary(dtype, device, assert_close):
    # GPT-2's real padded vocabulary (50257 -> 50304): a row spans many blocks. Few rows, so the
    # CPU interpreter runs it in seconds.
    _check(2, 50304, dtype, device, assert_close)


def test_target_outside_shard_contributes_no_gradient_spike(device):
    # On its own shard, a target owned by another rank gives grad = softmax (no -1 anywhere).
    logits = torch.randn(4, 10, device=device, requires_grad=True)
    target = torch.tensor([10, 11, 25, 3], device=device)
    for use_kernel in (True, False):
        loss = vocab_parallel_cross_entropy(
            logits, target, vocab_start_index=10, use_kernel=use_kernel
        )
        (grad,) = torch.autograd.grad(loss.sum(), logits)
        softmax = torch.softmax(logits.detach(), dim=-1)
        expected = softmax.clone()
        expected[0, 0] -= 1
        expected[1, 1] -= 1
        assert torch.allclose(grad, expected, atol=1e-6)
        lse = torch.logsumexp(logits.detach(), dim=-1)
        assert torch.allclose(
            loss,
            lse - torch.stack([logits[0, 0], logits[1, 1], lse[2] * 0, lse[3] * 0]).detach(),
            atol=1e-5,
        )


def test_inputs_are_checked():
    with pytest.raises(ValueError, match="target must be int64"):
        vocab_parallel_cross_entropy(
            torch.randn(2, 5), torch.zeros(2, dtype=torch.int32), use_kernel=False
        )
    with pytest.raises(ValueError, match=r"expected logits \(N, V_local\)"):
        vocab_parallel_cross_entropy(
            torch.randn(2, 3, 5), torch.zeros(2, dtype=torch.int64), use_kernel=False
        )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_rows,vocab", [(16 * 1024, 50304), (4097, 25152), (33, 131073)])
def test_cross_entropy_matches_reference_gpu(num_rows, vocab, dtype, device, assert_close):
    _check(num_rows, vocab, dtype, device, assert_close)
