"""rotary_qkv: the Triton split-and-rotate (GPU, or the CPU interpreter) against its pure-torch
reference, forward and backward, and the reference against transformers' Llama rotation
(apply_rotary_pos_emb) on the split of the grouped layout written out by hand."""

import zlib

import pytest
import torch
from mds_model.attention import RotaryEmbedding
from mds_model.kernels import rotary_qkv
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

DTYPES = [torch.float32, torch.bfloat16]


def tables(seq: int, rotary_dim: int, base: float = 10000.0):
    rotary = RotaryEmbedding(rotary_dim, max_positions=seq + 3, base=base)
    return rotary.cos, rotary.sin


def inputs(seq, batch, groups, per_group, head_dim, dtype, device):
    gen = torch.Generator().manual_seed(
        zlib.crc32(repr((seq, groups, per_group, head_dim)).encode())
    )
    width = groups * (per_group + 2) * head_dim
    qkv = torch.randn(seq, batch, width, generator=gen).to(device, dtype).requires_grad_()
    grads = [torch.randn(shape, generator=gen).to(device, dtype) for shape in (
        (batch, groups * per_group, seq, head_dim),
        (batch, groups, seq, head_dim),
        (batch, groups, seq, head_dim),
    )]  # fmt: skip
    return qkv, grads


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("groups", "per_group", "head_dim", "rotary_dim"),
    [(2, 4, 16, 16), (3, 1, 8, 8), (1, 2, 20, 10), (2, 2, 12, 4)],
    ids=["grouped", "per-head", "odd-head-partial", "quarter"],
)
def test_kernel_matches_reference(
    groups, per_group, head_dim, rotary_dim, dtype, device, assert_close
):
    seq, batch = 7, 3
    cos, sin = (t.to(device) for t in tables(seq, rotary_dim))
    qkv, grads = inputs(seq, batch, groups, per_group, head_dim, dtype, device)
    results = []
    for use_kernel in (True, False):
        out = rotary_qkv(
            qkv, cos, sin, groups=groups, per_group=per_group, head_dim=head_dim,
            use_kernel=use_kernel,
        )  # fmt: skip
        (dqkv,) = torch.autograd.grad(out, qkv, grads)
        results.append((*out, dqkv))
    for name, got, want in zip(("q", "k", "v", "dqkv"), *results, strict=True):
        assert got.shape == want.shape and got.is_contiguous(), name
        assert_close(got, want, dtype, f"rotary_qkv {name}")


def test_reference_is_transformers_llama_rotation():
    """The grouped rows split by hand ([queries, key, value] per group) and rotated by
    transformers' apply_rotary_pos_emb with its own cos/sin: the reference's q and k."""
    seq, batch, groups, per_group, head_dim = 6, 2, 2, 3, 8
    cos, sin = tables(seq, head_dim, base=500000.0)
    qkv, _ = inputs(seq, batch, groups, per_group, head_dim, torch.float32, "cpu")
    q, k, v = rotary_qkv(
        qkv, cos, sin, groups=groups, per_group=per_group, head_dim=head_dim, use_kernel=False
    )
    rows = qkv.detach().view(seq, batch, groups, per_group + 2, head_dim)
    hf_q = rows[:, :, :, :per_group].reshape(seq, batch, -1, head_dim).permute(1, 2, 0, 3)
    hf_k = rows[:, :, :, per_group].permute(1, 2, 0, 3)
    hf_v = rows[:, :, :, per_group + 1].permute(1, 2, 0, 3)
    hf_q, hf_k = apply_rotary_pos_emb(hf_q, hf_k, cos[:seq][None], sin[:seq][None])
    for got, want in ((q, hf_q), (k, hf_k), (v, hf_v)):
        torch.testing.assert_close(got.detach(), want, rtol=1e-6, atol=1e-6)


def test_bad_shapes_are_one_line():
    cos, sin = tables(4, 8)
    with pytest.raises(ValueError, match=r"qkv must be \(S, B, 48\)"):
        rotary_qkv(torch.zeros(4, 1, 40), cos, sin, groups=1, per_group=4, head_dim=8,
                   use_kernel=False)  # fmt: skip
    with pytest.raises(ValueError, match="an even rotary dim <= 8"):
        rotary_qkv(torch.zeros(9, 1, 48), cos, sin, groups=1, per_group=4, head_dim=8,
                   use_kernel=False)  # fmt: skip
