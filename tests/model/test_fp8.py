"""FP8 linears (mds_model.fp8): Transformer Engine's delayed-scaling formulas written out here from
its source, the cast against torch's own FP8 cast, the linear against a dequantize-then-matmul
oracle in fp32, and the per-step state a run saves and resumes.

On CPU, `torch._scaled_mm` runs through torch's CPU kernel, so the autograd function's operands,
layouts and scales are checked in CI; the GPU tests (-m gpu) check the Triton cast bit for bit
against torch's cast and the FP8 linear against a bf16 one on Hopper.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from mds_model import GPT, GPTConfig
from mds_model.fp8 import Fp8Recipe, enable_fp8
from mds_model.fp8.cast import cast_reference, cast_to_fp8
from mds_model.fp8.linear import Fp8Slot, fp8_linear
from mds_model.fp8.recipe import E4M3_MAX, E5M2_MAX, updated_scales

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def te_scales(history, scale, fp8_max, margin, algo):
    """Transformer Engine's `_default_get_amax_and_update_history` + `_default_sf_compute`
    (transformer_engine/pytorch/fp8.py, 1.x): the amax of the window or the most recent, then
    sf = fp8_max / amax / 2**margin, kept where amax is 0 or not finite."""
    amax = torch.max(history, dim=0).values if algo == "max" else history[0].clone()
    sf = (fp8_max / amax) / (2**margin)
    sf = torch.where(amax > 0.0, sf, scale)
    sf = torch.where(torch.isfinite(amax), sf, scale)
    return torch.where(torch.isinf(sf), torch.full_like(sf, torch.finfo(torch.float32).max), sf)


@pytest.mark.parametrize("algo", ["most_recent", "max"])
@pytest.mark.parametrize("margin", [0, 2])
def test_scales_follow_transformer_engines_formula(algo, margin):
    history = torch.tensor(
        [
            [[3.0, 0.0, float("inf")], [1e-42, 2.5, 7.0]],
            [[9.0, 4.0, 1.0], [2.0, 0.5, 70.0]],
            [[1.0, 1.0, 1.0], [float("nan"), 1.0, 1.0]],
        ]
    )
    scale = torch.tensor([[2.0, 3.0, 5.0], [7.0, 11.0, 13.0]])
    maxima = torch.tensor([E4M3_MAX, E4M3_MAX, E5M2_MAX])
    recipe = Fp8Recipe("hybrid", margin=margin, amax_history_len=3, amax_compute_algo=algo)
    got = updated_scales(history, scale, maxima, recipe)
    want = te_scales(history, scale, maxima, margin, algo)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_recipe_dtypes_and_checks():
    assert Fp8Recipe("hybrid").dtypes() == (E4M3, E5M2)
    assert Fp8Recipe("e4m3").dtypes() == (E4M3, E4M3)
    assert Fp8Recipe("hybrid").role_maxima() == (448.0, 448.0, 57344.0)
    for bad, message in [
        (dict(fmt="e5m2"), "FP8 format"),
        (dict(fmt="hybrid", interval=0), "--fp8-interval"),
        (dict(fmt="hybrid", amax_history_len=0), "--fp8-amax-history-len"),
        (dict(fmt="hybrid", amax_compute_algo="mean"), "--fp8-amax-compute-algo"),
        (dict(fmt="hybrid", margin=-1), "--fp8-margin"),
    ]:
        with pytest.raises(ValueError, match=message):
            Fp8Recipe(**bad)


@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_reference_cast_scales_clamps_and_records_the_amax(dtype):
    x = torch.tensor([[1.0, -3.0, 1e6], [-1e6, 0.25, 0.0]], dtype=torch.bfloat16)
    amax = torch.tensor(2.0)
    out, out_t = cast_reference(x, torch.tensor(4.0), amax, dtype, transpose=True)
    finite = torch.finfo(dtype).max
    want = torch.tensor([[4.0, -12.0, finite], [-finite, 1.0, 0.0]])
    assert out.dtype == dtype and torch.equal(out.float(), want)  # clamped, never NaN
    assert torch.equal(out_t.float(), want.t()) and out_t.is_contiguous()
    assert amax.item() == pytest.approx(x.float().abs().max().item())
    untouched = torch.tensor(5.0)
    cast_reference(x, torch.tensor(1.0), None, dtype, transpose=False)
    assert untouched.item() == 5.0


@pytest.mark.parametrize("dtype", [E4M3, E5M2])
@pytest.mark.parametrize("shape", [(70, 33), (16, 128), (1, 5)])
def test_triton_cast_matches_the_reference_through_the_interpreter(dtype, shape):
    """Triton's interpreter rounds some values to FP8 unlike the hardware (a binade off), so the
    inputs here are exactly representable after scaling: this checks the kernel's tiling, masks,
    transpose, clamp and amax; the GPU test checks its rounding against torch's cast."""
    generator = torch.Generator().manual_seed(0)
    representable = torch.randn(shape, generator=generator).to(dtype).float()
    scale = torch.tensor(8.0)
    x = (representable / scale).to(torch.bfloat16)  # a power-of-two scale: exact in bf16 too
    x.view(-1)[0] = 1e5  # clamped
    amax_ref, amax_kernel = torch.tensor(0.5), torch.tensor(0.5)
    want, want_t = cast_reference(x, scale, amax_ref, dtype, transpose=True)
    got, got_t = cast_to_fp8(x, scale, amax_kernel, dtype, transpose=True, use_kernel=True)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert torch.equal(got_t.view(torch.uint8), want_t.view(torch.uint8))
    assert amax_kernel.item() == amax_ref.item() == x.float().abs().max().item() > 9e4
    no_amax = torch.tensor(0.5)
    got, none = cast_to_fp8(x, scale, None, dtype, transpose=False, use_kernel=True)
    assert none is None and no_amax.item() == 0.5


def slot(recipe: Fp8Recipe, scales: tuple[float, float, float]) -> Fp8Slot:
    return Fp8Slot.standalone(recipe, scales, device="cpu", use_kernel=False)


def dequantized(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """What the FP8 operand holds, as fp32: the oracle's matmul inputs."""
    finite = torch.finfo(dtype).max
    return (x.float() * scale).clamp(-finite, finite).to(dtype).float() / scale


@pytest.mark.parametrize("fmt", ["hybrid", "e4m3"])
@pytest.mark.parametrize("fp8_wgrad", [True, False])
@pytest.mark.parametrize("with_bias", [True, False])
def test_fp8_linear_is_the_matmul_of_its_dequantized_operands(fmt, fp8_wgrad, with_bias):
    """Forward and both gradients against fp32 matmuls of the operands as FP8 holds them; the
    only differences left are the GEMMs' accumulation order and the bf16 outputs' rounding."""
    recipe = Fp8Recipe(fmt, fp8_wgrad=fp8_wgrad)
    forward, backward = recipe.dtypes()
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(3, 16, 32, generator=generator).to(torch.bfloat16).requires_grad_()
    weight = (0.05 * torch.randn(48, 32, generator=generator)).to(torch.bfloat16).requires_grad_()
    bias = torch.randn(48, generator=generator).to(torch.bfloat16).requires_grad_()
    grad = (1e-3 * torch.randn(3, 16, 48, generator=generator)).to(torch.bfloat16)
    scales = (32.0, 4096.0, 2.0**20)
    y = fp8_linear(x, weight, bias if with_bias else None, slot(recipe, scales), record=True)
    y.backward(grad)

    xq, wq = dequantized(x, scales[0], forward), dequantized(weight, scales[1], forward)
    gq = dequantized(grad, scales[2], backward)
    want_y = xq @ wq.t() + (bias.float() if with_bias else 0.0)
    want_dx = gq @ wq
    rows_g = gq.reshape(-1, 48) if fp8_wgrad else grad.float().reshape(-1, 48)
    rows_x = xq.reshape(-1, 32) if fp8_wgrad else x.float().reshape(-1, 32)
    want_dw = rows_g.t() @ rows_x

    def close(got, want):  # bf16 outputs: 2**-8 relative rounding, plus accumulation order
        want = want.detach()
        atol = 1e-2 * want.abs().max().item()
        torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=atol)

    assert y.dtype == torch.bfloat16 and y.shape == (3, 16, 48)
    close(y, want_y)
    close(x.grad, want_dx)
    close(weight.grad, want_dw)
    if with_bias:
        close(bias.grad, grad.float().sum(dim=(0, 1)))


def tiny_model(**overrides) -> GPT:
    fields = dict(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        vocab_size=64,
        seq_length=16,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_fused_kernels=False,
        params_dtype="bfloat16",
    )
    config = GPTConfig(**{**fields, **overrides})
    return GPT(config, init_seed=1)


def linear_inputs(model: GPT, tokens: torch.Tensor, names: list[str]) -> dict[str, torch.Tensor]:
    """Each FP8 linear's input in one forward, caught by hooks."""
    seen, modules = {}, dict(model.named_modules())
    hooks = [
        modules[name].register_forward_pre_hook(
            lambda _, args, name=name: seen.__setitem__(name, args[0].detach())
        )
        for name in names
    ]
    try:
        model.logits(tokens)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def test_the_first_step_calibrates_in_16_bits_then_fp8_takes_over():
    """Transformer Engine's first step casts with scale 1; here it computes as without FP8 and
    records the amaxes, and its update sets every scale, whatever the interval."""
    plain = tiny_model()
    model = copy.deepcopy(plain)
    fp8 = enable_fp8(model, Fp8Recipe("hybrid", interval=5), use_kernel=False)
    tokens = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    assert torch.equal(model.logits(tokens), plain.logits(tokens))
    model.logits(tokens).float().square().mean().backward()
    plain.logits(tokens).float().square().mean().backward()
    for (name, ours), theirs in zip(model.named_parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=0, atol=0, msg=name)
    assert torch.all(fp8.amax > 0)  # every role of every linear recorded
    recorded = fp8.amax.clone()
    fp8.update(iteration=1, groups=[])
    maxima = torch.tensor([E4M3_MAX, E4M3_MAX, E5M2_MAX])
    torch.testing.assert_close(fp8.scale, maxima / recorded, rtol=0, atol=0)
    assert not fp8.calibrating and not any(slot.calibrating for slot in fp8.slots)
    assert not torch.equal(model.logits(tokens), plain.logits(tokens))  # FP8 from now on


def test_enable_covers_the_layers_linears_and_records_their_amaxes():
    model = tiny_model()
    fp8 = enable_fp8(model, Fp8Recipe("hybrid"), use_kernel=False)
    fp8.update(iteration=1, groups=[])  # past the calibration step
    layer = ["self_attention.query_key_value", "self_attention.dense"]
    layer += ["mlp.dense_h_to_4h", "mlp.dense_4h_to_h"]
    assert fp8.names == [f"layers.{i}.{name}" for i in range(2) for name in layer]
    tokens = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    inputs = linear_inputs(model, tokens, fp8.names)  # the first training forward
    modules = dict(model.named_modules())
    for index, name in enumerate(fp8.names):
        assert fp8.amax[index, 0] == inputs[name].float().abs().max()
        assert fp8.amax[index, 1] == modules[name].weight.float().abs().max()
    assert torch.all(fp8.amax[:, 2] == 0)  # no backward yet
    recorded = fp8.amax.clone()
    model.eval()
    linear_inputs(model, tokens.flip(0), fp8.names)  # evaluation leaves the scaling alone
    assert torch.equal(fp8.amax, recorded)


def test_update_moves_amaxes_into_the_history_and_rescales_every_interval():
    model = tiny_model()
    recipe = Fp8Recipe("hybrid", interval=2, amax_history_len=3, amax_compute_algo="max")
    fp8 = enable_fp8(model, recipe, use_kernel=False)
    tokens = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    amaxes, last_scales = [], None
    for iteration in (1, 2, 3, 4):
        model.logits(tokens).float().square().mean().backward()
        amaxes.append(fp8.amax.clone())
        fp8.update(iteration=iteration, groups=[])
        assert torch.all(fp8.amax == 0)
        want_history = torch.stack(amaxes[::-1][:3])
        torch.testing.assert_close(fp8.amax_history[: len(amaxes)], want_history[:3])
        if iteration == 3:  # not a multiple of the interval: iteration 2's scales stay
            torch.testing.assert_close(fp8.scale, last_scales, rtol=0, atol=0)
        if iteration in (1, 2, 4):  # 1: the calibration step's update sets them all
            window = torch.stack(amaxes[-3:]).amax(dim=0)
            want = torch.tensor([E4M3_MAX, E4M3_MAX, E5M2_MAX]) / window
            torch.testing.assert_close(fp8.scale, want, rtol=0, atol=0)
            torch.testing.assert_close(fp8.scale_inv, 1.0 / want)
            last_scales = fp8.scale.clone()
        with torch.no_grad():
            for param in model.parameters():  # weights move, as an optimizer step would
                param.mul_(1.01)


def test_the_fp8_weight_is_cast_again_after_an_update_or_a_weight_change():
    model = tiny_model()
    fp8 = enable_fp8(model, Fp8Recipe("hybrid"), use_kernel=False)
    fp8.update(iteration=1, groups=[])  # past the calibration step
    tokens = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    first = model.logits(tokens)
    cached = fp8.slots[0].weight_cache
    assert model.logits(tokens) is not None and fp8.slots[0].weight_cache is cached  # kept
    with torch.no_grad():
        model.layers[0].self_attention.query_key_value.weight.mul_(2.0)
    changed = model.logits(tokens)
    assert fp8.slots[0].weight_cache is not cached and not torch.equal(changed, first)
    fp8.update(iteration=1, groups=[])
    assert all(slot.weight_cache is None for slot in fp8.slots)


def test_the_scaling_state_round_trips_and_refuses_another_layout():
    model = tiny_model()
    recipe = Fp8Recipe("hybrid", amax_history_len=2)
    fp8 = enable_fp8(model, recipe, use_kernel=False)
    tokens = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    for iteration in (1, 2):
        model.logits(tokens).float().square().mean().backward()
        fp8.update(iteration=iteration, groups=[])
    model.logits(tokens)  # a step under way: its amaxes are state too
    saved = copy.deepcopy(fp8.state_dict())

    other = enable_fp8(tiny_model(), recipe, use_kernel=False)
    assert other.load_state_dict(saved) is None
    for name in ("amax", "amax_history", "scale", "scale_inv"):
        assert torch.equal(getattr(other, name), getattr(fp8, name)), name
    assert not other.calibrating and not other.slots[0].calibrating

    deeper = enable_fp8(tiny_model(num_layers=3), recipe, use_kernel=False)
    assert "another TP/PP layout" in deeper.load_state_dict(saved)
    longer = enable_fp8(tiny_model(), Fp8Recipe("hybrid", amax_history_len=4), use_kernel=False)
    assert "--fp8-amax-history-len" in longer.load_state_dict(saved)
    assert torch.all(longer.scale == 1.0)


# --- on the GPU --------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [E4M3, E5M2])
@pytest.mark.parametrize("shape", [(4096, 1024), (333, 200)])
def test_gpu_triton_cast_is_torchs_cast_bit_for_bit(dtype, shape):
    x = (torch.randn(shape, device="cuda") * 300).to(torch.bfloat16)  # some past E4M3's range
    scale = torch.tensor(1.37, device="cuda")
    amax_ref, amax_kernel = torch.zeros((), device="cuda"), torch.zeros((), device="cuda")
    want, want_t = cast_reference(x, scale, amax_ref, dtype, transpose=True)
    got, got_t = cast_to_fp8(x, scale, amax_kernel, dtype, transpose=True, use_kernel=True)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert torch.equal(got_t.view(torch.uint8), want_t.view(torch.uint8))
    assert amax_kernel.item() == amax_ref.item()


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["hybrid", "e4m3"])
def test_gpu_fp8_linear_follows_the_bf16_linear(fmt):
    """A 1.3B-shaped MLP projection (8192 tokens, 2048 -> 8192) on activations and weights of
    training's scale, with scales from the previous call's amaxes (delayed scaling's steady state).

    Tolerances: rounding to E4M3 (3 mantissa bits) errs by up to 2**-4 relative, about 3.6% RMS on
    values spread over a binade; a dot product of two such operands keeps that relative RMS, so
    the output is within 5%. E5M2 (2 bits) doubles the gradient's share: input gradients within
    10% with hybrid; the weight gradient sums 8192 tokens of such products, within 10% as well."""
    torch.manual_seed(0)
    recipe = Fp8Recipe(fmt)
    x = torch.randn(8, 1024, 2048, device="cuda", dtype=torch.bfloat16)
    weight = (0.02 * torch.randn(8192, 2048, device="cuda")).to(torch.bfloat16)
    grad = (1e-4 * torch.randn(8, 1024, 8192, device="cuda")).to(torch.bfloat16)
    ref_x, ref_w = x.clone().requires_grad_(), weight.clone().requires_grad_()
    F.linear(ref_x, ref_w).backward(grad)

    maxima = torch.tensor(recipe.role_maxima(), device="cuda")
    amaxes = torch.stack([t.float().abs().max() for t in (x, weight, grad)])
    scales = tuple((maxima / amaxes).tolist())
    fp8_slot = Fp8Slot.standalone(recipe, scales, device="cuda", use_kernel=True)
    got_x, got_w = x.clone().requires_grad_(), weight.clone().requires_grad_()
    y = fp8_linear(got_x, got_w, None, fp8_slot, record=True)
    y.backward(grad)
    assert relative_error(y, F.linear(x, weight)) < 0.05
    assert relative_error(got_x.grad, ref_x.grad) < 0.10
    assert relative_error(got_w.grad, ref_w.grad) < 0.10
