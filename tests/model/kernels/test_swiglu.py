"""swiglu: Triton kernel (GPU, or the CPU interpreter) against the pure-torch reference, and the
reference against transformers' LlamaMLP and Megatron-DeepSpeed's `--swiglu` activation."""

import zlib

import pytest
import torch
import torch.nn.functional as F
from mds_model.kernels import swiglu
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _check(shape, dtype, device, assert_close, *, scale=2.0, y=None):
    """shape is the output's (..., f); y is (..., 2f) unless given (e.g. a strided view)."""
    gen = torch.Generator().manual_seed(zlib.crc32(repr((shape, str(dtype))).encode()))
    if y is None:
        y = (torch.randn(*shape[:-1], 2 * shape[-1], generator=gen) * scale).to(device, dtype)
    y.requires_grad_()
    dout = torch.randn(shape, generator=gen).to(device, dtype)
    results = []
    for use_kernel in (True, False):
        out = swiglu(y, use_kernel=use_kernel)
        (dy,) = torch.autograd.grad(out, y, dout)
        results.append((out, dy))
    (out, dy), (want_out, want_dy) = results
    assert_close(out, want_out, dtype, f"swiglu out {shape}")
    f = shape[-1]
    # Both halves of dy on their own, so a small one cannot hide behind the other.
    assert_close(dy[..., :f], want_dy[..., :f], dtype, f"swiglu dgate {shape}")
    assert_close(dy[..., f:], want_dy[..., f:], dtype, f"swiglu dup {shape}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 3), (5, 7), (3, 13, 129), (37, 1000), (3, 4100)])
def test_swiglu_matches_reference(shape, dtype, device, assert_close):
    _check(shape, dtype, device, assert_close)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_reads_a_strided_view(dtype, device, assert_close):
    # y a slice of a wider buffer: rows are stride 2f + 6 apart and the kernel must follow them.
    gen = torch.Generator().manual_seed(3)
    wide = torch.randn(9, 2 * 300 + 6, generator=gen).to(device, dtype)
    _check((9, 300), dtype, device, assert_close, y=wide[:, 3 : 3 + 600])


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")  # numpy's
@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_saturates_without_overflow(dtype, device, assert_close):
    # gate up to ~+-150: exp(-gate) overflows to inf, silu must give 0 and gate, never NaN.
    _check((9, 65), dtype, device, assert_close, scale=50.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_is_llama_mlp_act_bit_for_bit(dtype):
    """LlamaMLP: down_proj(act_fn(gate_proj(x)) * up_proj(x)), act "silu": [gate; up] of one
    dense_h_to_4h product gives the same values and gradients: the same bits in bf16 and fp16, and
    within 2 ulp in fp32, where torch's CPU silu rounds a strided half (upstream's chunk, as here)
    and a contiguous tensor (LlamaMLP's gate_proj output) a few elements apart in the last bit."""

    def same(actual, expected, *, atol=0.0):
        if dtype == torch.float32:
            torch.testing.assert_close(actual, expected, rtol=2.4e-7, atol=atol)
        else:
            assert torch.equal(actual, expected)

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=48, intermediate_size=130, num_attention_heads=4, hidden_act="silu"
    )
    mlp = LlamaMLP(config).to(dtype)
    x = torch.randn(3, 5, 48).to(dtype)
    gate = mlp.gate_proj(x).detach().requires_grad_()
    up = mlp.up_proj(x).detach().requires_grad_()
    want = mlp.act_fn(gate) * up
    y = torch.cat([gate, up], dim=-1).detach().requires_grad_()
    got = swiglu(y, use_kernel=False)
    assert got.shape == (3, 5, 130) and got.dtype == dtype
    same(got, want)
    same(mlp.down_proj(got), mlp(x), atol=1e-8)  # sums of 130 products: ulps of the terms
    dout = torch.randn(3, 5, 130).to(dtype)
    (dy,) = torch.autograd.grad(got, y, dout)
    dgate, dup = torch.autograd.grad(want, (gate, up), dout)
    same(dy, torch.cat([dgate, dup], dim=-1))


def test_reference_is_megatron_deepspeed_swiglu():
    """megatron/model/transformer.py's swiglu: chunk in two on the last dim, silu of the first
    half (gate) times the second (up) — not the bigscience fork's x1 * act(x2)."""
    y = torch.randn(4, 2 * 17, dtype=torch.float64)
    x = torch.chunk(y, 2, dim=-1)
    assert torch.equal(swiglu(y, use_kernel=False), F.silu(x[0]) * x[1])
    gate, up = y[:, :17], y[:, 17:]
    assert torch.allclose(swiglu(y, use_kernel=False), gate * torch.sigmoid(gate) * up)
    assert not torch.allclose(swiglu(y, use_kernel=False), up * torch.sigmoid(up) * gate)


def test_odd_width_is_refused():
    with pytest.raises(ValueError, match=r"must be even, got shape \(2, 7\)"):
        swiglu(torch.randn(2, 7), use_kernel=False)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape", [(16 * 1024, 4096), (4, 1000, 11008), (4099, 2731), (3, 5, 13824)]
)
def test_swiglu_matches_reference_gpu(shape, dtype, device, assert_close):
    _check(shape, dtype, device, assert_close)
