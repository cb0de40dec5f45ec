"""MasterAdamWGroup.step: the Triton kernel (GPU, or the CPU interpreter) against the pure-torch
reference over odd sizes, gradient dtypes, a clipping divisor and misaligned views; and the
reference against torch's own AdamW on fp32 copies (the math it claims to be)."""

import zlib

import pytest
import torch
from mds_model.kernels.master_adamw import MasterAdamWGroup, master_adamw_reference

BETAS, EPS = (0.9, 0.95), 1e-8
# Absolute floors for values near 0, where the relative tolerance cannot hold: a master's error is
# a few fp32 roundings of its update (lr 3e-4 x a step of order 1), not of its own value.
ATOL = {"masters": 1e-8, "exp_avgs": 1e-9, "exp_avg_sqs": 1e-12}


def _state(sizes, *, param_dtype, grad_dtype, device, seed, offset=0):
    """Tensors of each role; with `offset`, views that start `offset` elements into a buffer (so
    addresses that are not multiples of 16 bytes)."""
    gen = torch.Generator().manual_seed(seed)

    def placed(values, dtype):
        view = torch.zeros(values.numel() + offset, dtype=dtype, device=device)[offset:]
        return view.copy_(values)

    def make(dtype, scale=1.0, positive=False):
        values = [torch.randn(n, generator=gen) * scale for n in sizes]
        return [placed(v.abs() if positive else v, dtype) for v in values]

    masters = make(torch.float32)
    return {
        "params": [placed(m, param_dtype) for m in masters],
        "grads": make(grad_dtype, 0.01),
        "masters": masters,
        "exp_avgs": make(torch.float32, 0.001),
        "exp_avg_sqs": make(torch.float32, 1e-6, positive=True),
        "steps": [torch.tensor(float(s), device=device) for s in range(3, 3 + len(sizes))],
    }


HYPER = dict(lr=3e-4, weight_decay=0.1, betas=BETAS, eps=EPS)


FIXED = ("params", "masters", "exp_avgs", "exp_avg_sqs", "steps")


def _run(state, *, use_kernel, grad_scale=None):
    if use_kernel:
        group = MasterAdamWGroup(*(state[key] for key in FIXED))
        group.step(state["grads"], **HYPER, grad_scale=grad_scale)
    else:
        master_adamw_reference(**state, **HYPER, grad_scale=grad_scale)


def _copy(state):
    return {key: [t.clone() for t in tensors] for key, tensors in state.items()}


SIZES = [[1], [7, 2049, 1], [5000, 3, 4096, 33]]


@pytest.mark.parametrize(
    "param_dtype,grad_dtype",
    [
        (torch.bfloat16, torch.bfloat16),
        (torch.bfloat16, torch.float32),
        (torch.float16, torch.float16),
        (torch.float32, torch.float32),
    ],
)
@pytest.mark.parametrize("sizes", SIZES)
@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("offset", [0, 1])
def test_kernel_matches_reference(sizes, param_dtype, grad_dtype, scaled, offset, device):
    seed = zlib.crc32(repr((sizes, str(param_dtype), str(grad_dtype), offset)).encode())
    dtypes = dict(param_dtype=param_dtype, grad_dtype=grad_dtype)
    ours = _state(sizes, **dtypes, device=device, seed=seed, offset=offset)
    want = _copy(ours)
    grad_scale = torch.tensor(1.7, device=device) if scaled else None
    group = MasterAdamWGroup(*(ours[key] for key in FIXED))
    assert group.matches(ours["params"])
    for _ in range(2):  # the group's tables reused, steps counted per tensor
        group.step(ours["grads"], **HYPER, grad_scale=grad_scale)
        _run(want, use_kernel=False, grad_scale=grad_scale)
    for key in ("masters", "exp_avgs", "exp_avg_sqs"):
        for got, expected in zip(ours[key], want[key], strict=True):
            torch.testing.assert_close(
                got, expected, rtol=2e-6, atol=ATOL[key], msg=lambda m, key=key: f"{key}: {m}"
            )
    for got, expected in zip(ours["steps"], want["steps"], strict=True):
        assert got.item() == expected.item()
    for param, master in zip(ours["params"], ours["masters"], strict=True):
        # The weights are the masters in the params' dtype (Triton's interpreter truncates to
        # bf16 where the GPU rounds: one step of that dtype).
        step, tiny = torch.finfo(param_dtype).eps, torch.finfo(param_dtype).smallest_normal
        if param_dtype == torch.float32:
            step = tiny = 0.0
        torch.testing.assert_close(param.float(), master.float(), rtol=step, atol=tiny)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_reference_is_torch_adamw(weight_decay):
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, generator=gen) for n in (5, 300)]
    params = [w.to(torch.bfloat16) for w in weights]
    masters = [w.clone() for w in weights]
    torch_masters = [w.clone().requires_grad_() for w in weights]
    adamw = torch.optim.AdamW(
        torch_masters, lr=1e-3, betas=BETAS, eps=EPS, weight_decay=weight_decay
    )
    moments = [[torch.zeros_like(w) for w in weights] for _ in range(2)]
    steps = [torch.tensor(0.0) for _ in weights]
    for _ in range(4):
        grads = [torch.randn(w.shape, generator=gen).to(torch.bfloat16) for w in weights]
        scale = torch.tensor(2.5)
        for master, grad in zip(torch_masters, grads, strict=True):
            master.grad = grad.float() / scale
        adamw.step()
        master_adamw_reference(
            params, grads, masters, *moments, steps, lr=1e-3, weight_decay=weight_decay,
            betas=BETAS, eps=EPS, grad_scale=scale,
        )  # fmt: skip
    for ours, theirs in zip(masters, torch_masters, strict=True):
        torch.testing.assert_close(ours, theirs.detach(), rtol=1e-6, atol=1e-7)
    for ours, master in zip(moments[0], torch_masters, strict=True):
        theirs = adamw.state[master]["exp_avg"]  # torch's lerp rounds apart from a*m + b*g
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
    assert [s.item() for s in steps] == [4.0, 4.0]


def test_lists_of_unequal_length_are_refused(device):
    state = _state([3], param_dtype=torch.float32, grad_dtype=torch.float32, device=device, seed=1)
    with pytest.raises(ValueError, match="one tensor per parameter"):
        MasterAdamWGroup(*(state[key] for key in FIXED)).step([], **HYPER)
    state["exp_avgs"] = []
    with pytest.raises(ValueError, match="one tensor per parameter"):
        MasterAdamWGroup(*(state[key] for key in FIXED))


@pytest.mark.gpu
def test_kernel_matches_reference_at_real_sizes():
    sizes = [50304 * 1024, 3 * 1024 * 1024, 1024, 4096 * 1024, 1]
    bf16 = dict(param_dtype=torch.bfloat16, grad_dtype=torch.bfloat16)
    ours = _state(sizes, **bf16, device="cuda", seed=7)
    want = _copy(ours)
    _run(ours, use_kernel=True, grad_scale=torch.tensor(3.0, device="cuda"))
    _run(want, use_kernel=False, grad_scale=torch.tensor(3.0, device="cuda"))
    for key in ("masters", "exp_avgs", "exp_avg_sqs"):
        for got, expected in zip(ours[key], want[key], strict=True):
            torch.testing.assert_close(
                got, expected, rtol=2e-6, atol=ATOL[key], msg=lambda m, key=key: f"{key}: {m}"
            )
