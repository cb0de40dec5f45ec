"""scaled_masked_softmax: Triton kernel (GPU, or the CPU interpreter) against the pure-torch
reference."""

import math
import zlib

import pytest
import torch
from mds_model.kernels import scaled_masked_softmax

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _check(shape, dtype, device, assert_close, *, causal, mask_shape=None, mask_rows=None):
    gen = torch.Generator().manual_seed(
        zlib.crc32(repr((shape, str(dtype), causal, mask_shape)).encode())
    )
    scale = 1.0 / math.sqrt(64)
    scores = (torch.randn(shape, generator=gen) * 8).to(device, dtype).requires_grad_()
    mask = None
    if mask_shape is not None:
        mask = (torch.rand(mask_shape, generator=gen) < 0.3).to(device)
        if mask_rows is not None:
            mask[..., mask_rows, :] = True  # fully masked query rows
    dprobs = torch.randn(shape, generator=gen).to(device, dtype)
    results = []
    for use_kernel in (True, False):
        probs = scaled_masked_softmax(
            scores, scale=scale, causal=causal, mask=mask, use_kernel=use_kernel
        )
        results.append((probs, *torch.autograd.grad(probs, scores, dprobs)))
    for name, got, want in zip(("probs", "dscores"), *results, strict=False):
        assert_close(got, want, dtype, f"softmax {name} {shape} causal={causal} mask={mask_shape}")
    probs = results[0][0]
    seq_q, seq_k = shape[-2:]
    masked = torch.zeros(seq_q, seq_k, dtype=torch.bool, device=device)
    if causal:
        masked = torch.ones_like(masked).triu(seq_k - seq_q + 1)
    if mask is not None:
        masked = masked | mask
    masked = masked.expand(shape)
    # Masked positions are exactly zero; rows with anything visible sum to one; fully masked rows
    # are zero.
    assert (probs[masked] == 0).all()
    visible = (~masked).any(dim=-1)
    sums = probs.float().sum(dim=-1)
    assert torch.allclose(sums[visible], torch.ones_like(sums[visible]), atol=1e-2)
    assert (sums[~visible] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 3, 7, 7), (1, 2, 129, 129), (2, 1, 5, 130)])
@pytest.mark.parametrize("causal", [True, False])
def test_softmax_matches_reference(shape, dtype, causal, device, assert_close):
    _check(shape, dtype, device, assert_close, causal=causal)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask_shape", [(2, 1, 6, 33), (6, 33), (2, 3, 6, 33)])
def test_softmax_with_boolean_mask(mask_shape, dtype, device, assert_close):
    # Row 2 fully masked: zeros instead of NaN, in the forward and the backward.
    _check(
        (2, 3, 6, 33), dtype, device, assert_close, causal=True, mask_shape=mask_shape, mask_rows=2
    )
    _check(
        (2, 3, 6, 33), dtype, device, assert_close, causal=False, mask_shape=mask_shape, mask_rows=2
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax_at_gpt2_context_length(dtype, device, assert_close):
    # GPT-2's 1024 keys, the last queries of a causal block (few rows for the interpreter).
    _check((1, 2, 3, 1024), dtype, device, assert_close, causal=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal", [True, False])
def test_softmax_long_rows_stream_in_blocks(dtype, causal, device, assert_close):
    # Sk > 8192 takes the two-pass blocked path; Sq < Sk is the cached-generation layout.
    _check((1, 1, 3, 9001), dtype, device, assert_close, causal=causal, mask_shape=(1, 1, 3, 9001))


def test_causal_with_fewer_queries_than_keys():
    scores = torch.zeros(1, 1, 2, 5)
    probs = scaled_masked_softmax(scores, scale=1.0, causal=True, use_kernel=False)
    # Query 0 is position 3 of 5: it sees keys 0..3; query 1 (position 4) sees all five.
    assert torch.allclose(probs[0, 0], torch.tensor([[0.25] * 4 + [0.0], [0.2] * 5]))


def test_mask_is_checked():
    scores = torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match="mask must be bool"):
        scaled_masked_softmax(
            scores, scale=1.0, causal=False, mask=torch.zeros(3, 4), use_kernel=False
        )
    with pytest.raises(ValueError, match="does not broadcast"):
        scaled_masked_softmax(
            scores,
            scale=1.0,
            causal=False,
            mask=torch.zeros(3, 5, dtype=torch.bool),
            use_kernel=False,
        )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape", [(4, 16, 1024, 1024), (2, 8, 1000, 1000), (1, 4, 77, 2049), (1, 2, 16, 20000)]
)
@pytest.mark.parametrize("causal", [True, False])
def test_softmax_matches_reference_gpu(shape, dtype, causal, device, assert_close):
    _check(
        shape,
        dtype,
        device,
        assert_close,
        causal=causal,
        mask_shape=(shape[0], 1, *shape[2:]),
        mask_rows=3,
    )
