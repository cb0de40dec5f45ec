"""The norms a layer is built with (mds_model.layers: LayerNorm, RMSNorm, chosen by the config's
`normalization` in `norm_for`): RMSNorm's module against transformers' LlamaRMSNorm, the
reference it must equal, for forward and the fused residual add."""

import pytest
import torch
from mds_model.layers import NORMS, LayerNorm, RMSNorm
from transformers.models.llama.modeling_llama import LlamaRMSNorm


def test_each_normalization_has_its_module():
    assert NORMS == {"layernorm": LayerNorm, "rmsnorm": RMSNorm}
    assert [n for n, _ in RMSNorm(8, eps=1e-6, use_kernel=False).named_parameters()] == ["weight"]
    names = [n for n, _ in LayerNorm(8, eps=1e-6, use_kernel=False).named_parameters()]
    assert names == ["weight", "bias"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_is_llama_s(dtype):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 64, generator=generator).to(dtype)
    residual = torch.randn(3, 5, 64, generator=generator).to(dtype)
    weight = (1 + 0.1 * torch.randn(64, generator=generator)).to(dtype)
    ours = RMSNorm(64, eps=1e-5, use_kernel=False, dtype=dtype)
    theirs = LlamaRMSNorm(64, eps=1e-5).to(dtype)
    with torch.no_grad():
        ours.weight.copy_(weight)
        theirs.weight.copy_(weight)
    assert torch.equal(ours(x), theirs(x))
    normed, summed = ours.add_norm(x, residual)
    assert torch.equal(summed, x + residual)
    assert torch.equal(normed, theirs(x + residual))
