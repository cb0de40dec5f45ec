"""MasterWeightAdamW (bf16 weights, fp32 masters) against torch's AdamW run on fp32 copies, and its
state dict round trip."""

import pytest
import torch
from mds_train.master_weights import MasterWeightAdamW

# Where the Triton step runs: the GPU, else Triton's interpreter (tests/conftest.py sets it).
KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def groups(weight, bias):
    return [{"params": [weight], "weight_decay": 0.1}, {"params": [bias], "weight_decay": 0.0}]


def test_equals_adamw_on_fp32_copies_and_round_trips():
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(4, 3, dtype=torch.bfloat16))
    bias = torch.nn.Parameter(torch.randn(3, dtype=torch.bfloat16))
    reference = [p.detach().float().clone().requires_grad_() for p in (weight, bias)]
    ours = MasterWeightAdamW(groups(weight, bias), betas=(0.9, 0.95), eps=1e-8)
    theirs = torch.optim.AdamW(groups(*reference), lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    for group in ours.param_groups:
        group["lr"] = 1e-2  # the trainer's schedule sets the model's groups
    for _ in range(3):
        grads = [torch.randn(4, 3).bfloat16(), torch.randn(3).bfloat16()]
        for param, ref, grad in zip((weight, bias), reference, grads, strict=True):
            param.grad, ref.grad = grad, grad.float()
        ours.step()
        ours.zero_grad()
        theirs.step()
        theirs.zero_grad()
    assert torch.equal(ours.masters[0][0], reference[0].detach())
    assert torch.equal(weight.detach(), reference[0].detach().bfloat16())
    copy = MasterWeightAdamW(groups(weight, bias), betas=(0.9, 0.95), eps=1e-8)
    copy.load_state_dict(ours.state_dict())
    assert torch.equal(copy.masters[1][0], ours.masters[1][0])
    assert torch.equal(
        copy.inner.state_dict()["state"][0]["exp_avg"],
        ours.inner.state_dict()["state"][0]["exp_avg"],
    )


@pytest.mark.parametrize(
    ("fused", "use_kernel", "device"),
    [
        (False, False, "cpu"),
        (True, False, "cpu"),
        (False, True, KERNEL_DEVICE),
        pytest.param(True, False, "cuda", marks=pytest.mark.gpu),
    ],
)
def test_clipping_scales_the_gradients_the_step_uses(fused, use_kernel, device):
    """scale_gradients(c) then step equals AdamW on fp32 copies whose gradients are multiplied by
    c: fused or in the Triton step, inside the step (a grad_scale divides by 1 / c: within an
    fp32 rounding), else before it (exactly)."""
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(4, 3, dtype=torch.bfloat16, device=device))
    bias = torch.nn.Parameter(torch.randn(3, dtype=torch.bfloat16, device=device))
    reference = [p.detach().float().clone().requires_grad_() for p in (weight, bias)]
    ours = MasterWeightAdamW(
        groups(weight, bias), betas=(0.9, 0.95), eps=1e-8, fused=fused, use_kernel=use_kernel
    )
    theirs = torch.optim.AdamW(groups(*reference), lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    for group in ours.param_groups:
        group["lr"] = 1e-2
    for coefficient in (0.3, 1.0, 0.07):
        grads = [torch.randn(4, 3).bfloat16().to(device), torch.randn(3).bfloat16().to(device)]
        for param, ref, grad in zip((weight, bias), reference, grads, strict=True):
            param.grad, ref.grad = grad, grad.float() * coefficient
        ours.scale_gradients(torch.tensor(coefficient, device=device))
        ours.step()
        ours.zero_grad()
        theirs.step()
        theirs.zero_grad()
    for master, ref in zip((m for group in ours.masters for m in group), reference, strict=True):
        if fused or use_kernel:
            torch.testing.assert_close(master, ref.detach(), rtol=1e-6, atol=1e-7)
        else:
            assert torch.equal(master, ref.detach())
    assert not hasattr(ours.inner, "grad_scale")  # no scale left for a step without clipping
    assert ours._gradient_divisor is None
    # The weights are the masters in bf16 (the interpreter truncates where a GPU rounds).
    bf16_step = torch.finfo(torch.bfloat16).eps
    torch.testing.assert_close(weight.detach().float(), ours.masters[0][0], rtol=bf16_step, atol=0)


def _run_steps(optimizer, params, gradients):
    for group in optimizer.param_groups:
        group["lr"] = 1e-2
    for grads in gradients:
        for param, grad in zip(params, grads, strict=True):
            param.grad = grad.clone()
        optimizer.step()
        optimizer.zero_grad()


def test_kernel_and_torch_steps_resume_each_others_state():
    """The Triton step keeps torch's fused AdamW's state (float32 step tensors, exp_avg,
    exp_avg_sq): a state dict saved by either path, loaded by the other, continues as the first
    path would have (within fp32 roundings)."""
    torch.manual_seed(0)
    device = KERNEL_DEVICE
    gradients = [
        [torch.randn(4, 3).bfloat16().to(device), torch.randn(3).bfloat16().to(device)]
        for _ in range(4)
    ]

    def fresh(use_kernel):
        weight = torch.nn.Parameter(torch.arange(12.0, device=device).reshape(4, 3).bfloat16() / 7)
        bias = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16, device=device))
        return (weight, bias), MasterWeightAdamW(
            groups(weight, bias), betas=(0.9, 0.95), eps=1e-8, use_kernel=use_kernel
        )

    straight_params, straight = fresh(use_kernel=False)
    _run_steps(straight, straight_params, gradients)
    for first in (True, False):
        params, optimizer = fresh(use_kernel=first)
        _run_steps(optimizer, params, gradients[:2])
        saved = optimizer.state_dict()
        assert saved["inner"]["state"][0]["step"].item() == 2.0
        params_next, resumed = fresh(use_kernel=not first)
        resumed.load_state_dict(saved)
        _run_steps(resumed, params_next, gradients[2:])
        assert resumed.inner.state_dict()["state"][1]["step"].item() == 4.0
        for got, want in zip(resumed.masters, straight.masters, strict=True):
            torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-7)


def test_kernel_step_reads_the_reductions_fp32_sums():
    """With the reduction in backward (more micro-batches or replicas) the Triton step reads
    the fp32 sums: equal to torch's AdamW on those sums."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).to(KERNEL_DEVICE, torch.bfloat16)
    reference = [p.detach().float().clone().requires_grad_() for p in model.parameters()]
    optimizer = MasterWeightAdamW(
        [{"params": list(model.parameters()), "weight_decay": 0.1}],
        betas=(0.9, 0.95),
        eps=1e-8,
        use_kernel=True,
    )
    theirs = torch.optim.AdamW(reference, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    optimizer.param_groups[0]["lr"] = 1e-2
    optimizer.reduce_in_backward(
        list(model.parameters()),
        is_last_micro_batch=lambda: True,
        data_parallel_group=None,
        data_parallel_size=1,
    )
    model(torch.randn(3, 4, dtype=torch.bfloat16, device=KERNEL_DEVICE)).float().sum().backward()
    sums = dict(optimizer.master_gradients())
    assert all(grad.dtype == torch.float32 for grad in sums.values())
    for param, ref in zip(model.parameters(), reference, strict=True):
        ref.grad = sums[param].clone()
    optimizer.step()
    theirs.step()
    for master, ref in zip(optimizer.masters[0], reference, strict=True):
        torch.testing.assert_close(master, ref.detach(), rtol=1e-6, atol=1e-7)


def test_reduction_buckets_follow_the_models_order_not_the_groups():
    """The groups put weights before biases; backward produces the last layer's first, so the
    reduction must see the model's order or its first bucket waits for the whole backward."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)).to(torch.bfloat16)
    first, last = model
    split = [
        {"params": [first.weight, last.weight], "weight_decay": 0.1},
        {"params": [first.bias, last.bias], "weight_decay": 0.0},
    ]
    optimizer = MasterWeightAdamW(split, betas=(0.9, 0.95), eps=1e-8)
    optimizer.reduce_in_backward(
        list(model.parameters()),
        is_last_micro_batch=lambda: True,
        data_parallel_group=None,
        data_parallel_size=1,
    )
    assert optimizer._reduction._params == list(model.parameters())
    model(torch.randn(3, 4, dtype=torch.bfloat16)).float().sum().backward()
    gradients = dict(optimizer.master_gradients())
    assert torch.equal(gradients[last.bias], torch.full((2,), 3.0))  # d(sum)/d(bias): the rows


def test_gradients_are_reduced_in_backward_only_where_there_is_something_to_reduce(monkeypatch):
    """One replica, one micro-batch per step: the optimizer casts the gradients once after
    backward; more micro-batches (or a ramp-up to them): fp32 sums in backward (more replicas:
    the multiprocess tests, test_grad_sync.py)."""
    from types import SimpleNamespace

    from mds_train import model_setup
    from mds_train.cli import build_config
    from mds_train.config import Topology

    from .test_config import DATA, parse

    monkeypatch.setattr(model_setup, "skip_backward_allreduce", lambda engine: None)
    model = torch.nn.Linear(4, 2).to(torch.bfloat16)
    one = Topology(world_size=1, tensor_model_parallel_size=1, pipeline_model_parallel_size=1)

    def reduced(micro, global_batch=None, rampup=None):  # on one replica
        optimizer = MasterWeightAdamW(
            [{"params": list(model.parameters()), "weight_decay": 0.0}], betas=(0.9, 0.95), eps=1e-8
        )
        model_flags = "--num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 32"
        flags = [*DATA, *model_flags.split(), *"--train-samples 99 --lr 1e-3".split()]
        flags += ["--micro-batch-size", str(micro)]
        if global_batch is not None:
            flags += ["--global-batch-size", str(global_batch)]
        if rampup is not None:
            flags += ["--rampup-batch-size", *map(str, rampup)]
        config = build_config(parse(flags))
        groups = SimpleNamespace(dp_size=1, dp_group=None)
        engine = SimpleNamespace(is_gradient_accumulation_boundary=lambda: True)
        model_setup.apply_gradient_reduction_in_backward(
            engine, optimizer, model, config, one, groups
        )
        return optimizer._reduction is not None

    assert not reduced(4)
    assert not reduced(4, global_batch=4)
    assert reduced(4, global_batch=8)
    assert reduced(4, global_batch=8, rampup=(4, 4, 100))
    assert reduced(4, rampup=(4, 4, 100))


def test_a_loaded_state_is_what_the_kernel_steps_next():
    """Loading a state dict replaces the moment and step tensors; the Triton step must read the
    loaded ones, not the tables it kept of the old: replaying two steps from a saved state gives
    the same weights twice."""
    torch.manual_seed(0)
    device = KERNEL_DEVICE
    weight = torch.nn.Parameter(torch.randn(4, 3, device=device).bfloat16())
    bias = torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16, device=device))
    optimizer = MasterWeightAdamW(
        groups(weight, bias), betas=(0.9, 0.95), eps=1e-8, use_kernel=True
    )
    gradients = [
        [torch.randn(4, 3).bfloat16().to(device), torch.randn(3).bfloat16().to(device)]
        for _ in range(4)
    ]
    _run_steps(optimizer, (weight, bias), gradients[:2])
    saved = {key: value for key, value in optimizer.state_dict().items()}
    saved["inner"] = {  # a copy the later steps cannot change
        "state": {
            index: {name: tensor.clone() for name, tensor in state.items()}
            for index, state in saved["inner"]["state"].items()
        },
        "param_groups": saved["inner"]["param_groups"],
    }
    _run_steps(optimizer, (weight, bias), gradients[2:])
    first = [m.clone() for group in optimizer.masters for m in group]
    optimizer.load_state_dict(saved)
    _run_steps(optimizer, (weight, bias), gradients[2:])
    again = [m for group in optimizer.masters for m in group]
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a, b)
