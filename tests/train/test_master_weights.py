"""MasterWeightAdamW (bf16 weights, fp32 masters) against torch's AdamW run on fp32 copies, and its
state dict round trip."""

import pytest
import torch
from mds_train.master_weights import MasterWeightAdamW


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
    ("fused", "device"),
    [(False, "cpu"), (True, "cpu"), pytest.param(True, "cuda", marks=pytest.mark.gpu)],
)
def test_clipping_scales_the_gradients_the_step_uses(fused, device):
    """scale_gradients(c) then step equals AdamW on fp32 copies whose gradients are multiplied by
    c: fused, inside the step (its grad_scale divides by 1 / c: within an fp32 rounding), else
    before it (exactly)."""
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(4, 3, dtype=torch.bfloat16, device=device))
    bias = torch.nn.Parameter(torch.randn(3, dtype=torch.bfloat16, device=device))
    reference = [p.detach().float().clone().requires_grad_() for p in (weight, bias)]
    ours = MasterWeightAdamW(groups(weight, bias), betas=(0.9, 0.95), eps=1e-8, fused=fused)
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
        if fused:
            torch.testing.assert_close(master, ref.detach(), rtol=1e-6, atol=1e-7)
        else:
            assert torch.equal(master, ref.detach())
    assert not hasattr(ours.inner, "grad_scale")  # no scale left for a step without clipping


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
