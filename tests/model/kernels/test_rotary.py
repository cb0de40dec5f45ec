"""rotary_qkv: the Triton split-and-rotate (GPU, or the CPU interpreter) against its pure-torch
reference, forward and backward, and the reference against transformers' Llama rotation
(apply_rotary_pos_emb) on the split of the grouped layout written out by hand; decoding's
rotary_qkv_into_cache (per-row positions, keys and values into a cache's slots) against its
reference, and that reference against rotary_qkv at positions 0..S-1."""

import zlib

import pytest
import torch
from mds_model.attention import RotaryEmbedding
from mds_model.kernels import rotary_qkv, rotary_qkv_into_cache
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
    [(2, 4, 16, 16), (3, 1, 8, 8), (1, 2, 20, 10), (2, 2, 12, 4), (10, 1, 8, 8)],
    ids=["grouped", "per-head", "odd-head-partial", "quarter", "two-programs-of-groups"],
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
        assert got.shape == want.shape, name
        # the kernel's queries lie (S, B, heads, hd) in memory, for attention's output to follow
        laid_out = got.permute(2, 0, 1, 3) if name == "q" else got
        assert laid_out.is_contiguous(), name
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


def cache_inputs(batch, seq, slots, groups, per_group, head_dim, dtype, device):
    """qkv, distinct per-row positions (B, S) among the slots, and a cache's keys and values
    filled with noise (slots not written must keep it)."""
    gen = torch.Generator().manual_seed(zlib.crc32(repr((seq, slots, groups, head_dim)).encode()))
    width = groups * (per_group + 2) * head_dim
    qkv = torch.randn(seq, batch, width, generator=gen).to(device, dtype)
    positions = torch.stack([torch.randperm(slots, generator=gen)[:seq] for _ in range(batch)])
    kv = torch.randn(2, batch, groups, slots, head_dim, generator=gen).to(device, dtype)
    return qkv, positions.to(device), kv


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("groups", "per_group", "head_dim", "rotary_dim", "seq"),
    [(2, 4, 16, 16, 1), (3, 1, 8, 8, 3), (1, 2, 20, 10, 1), (2, 2, 12, 4, 5)],
    ids=["grouped-step", "per-head-prefill", "odd-head-partial", "quarter-prefill"],
)
def test_into_cache_kernel_matches_reference(
    groups, per_group, head_dim, rotary_dim, seq, dtype, device, assert_close
):
    batch, slots = 3, 9
    cos, sin = (t.to(device) for t in tables(slots, rotary_dim))
    qkv, positions, kv = cache_inputs(batch, seq, slots, groups, per_group, head_dim, dtype,
                                      device)  # fmt: skip
    results = []
    for use_kernel in (True, False):
        cache = kv.clone()
        q = rotary_qkv_into_cache(
            qkv, cos, sin, positions, cache[0], cache[1], groups=groups, per_group=per_group,
            head_dim=head_dim, use_kernel=use_kernel,
        )  # fmt: skip
        results.append((q, cache))
    (q, cache), (want_q, want_cache) = results
    assert q.shape == (batch, groups * per_group, seq, head_dim) and q.is_contiguous()
    assert_close(q, want_q, dtype, "rotary_qkv_into_cache q")
    assert_close(cache, want_cache, dtype, "rotary_qkv_into_cache keys and values")
    untouched = torch.ones(batch, slots, dtype=torch.bool, device=device)
    untouched[torch.arange(batch, device=device)[:, None], positions] = False
    # only the positions' slots: (B, slots) picked from (2, B, groups, slots, hd)
    picked = untouched[None, :, None, :, None].expand_as(kv)
    assert torch.equal(cache[picked], kv[picked])


def test_into_cache_reference_at_the_first_positions_is_rotary_qkv():
    seq, batch, groups, per_group, head_dim, slots = 5, 2, 2, 3, 8, 7
    cos, sin = tables(slots, head_dim)
    qkv, _, kv = cache_inputs(batch, seq, slots, groups, per_group, head_dim, torch.float32, "cpu")
    q = rotary_qkv_into_cache(
        qkv, cos, sin, torch.arange(seq).expand(batch, seq), kv[0], kv[1], groups=groups,
        per_group=per_group, head_dim=head_dim, use_kernel=False,
    )  # fmt: skip
    want_q, want_k, want_v = rotary_qkv(
        qkv, cos, sin, groups=groups, per_group=per_group, head_dim=head_dim, use_kernel=False
    )
    assert torch.equal(q, want_q)
    assert torch.equal(kv[0, :, :, :seq], want_k) and torch.equal(kv[1, :, :, :seq], want_v)


def test_into_cache_shapes_are_checked():
    cos, sin = tables(4, 8)
    kv = torch.zeros(2, 1, 1, 4, 8)
    with pytest.raises(ValueError, match=r"and positions \(B, S\)"):
        rotary_qkv_into_cache(
            torch.zeros(2, 1, 48),
            cos,
            sin,
            torch.zeros(1, 1, dtype=torch.long),
            kv[0],
            kv[1],
            groups=1,
            per_group=4,
            head_dim=8,
            use_kernel=False,
        )
    with pytest.raises(ValueError, match=r"keys and values must be \(B 1, groups 2"):
        rotary_qkv_into_cache(
            torch.zeros(1, 1, 80),
            cos,
            sin,
            torch.zeros(1, 1, dtype=torch.long),
            kv[0],
            kv[1],
            groups=2,
            per_group=3,
            head_dim=8,
            use_kernel=False,
        )
