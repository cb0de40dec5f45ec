"""MasterWeightAdamW (bf16 weights, fp32 masters) against torch's AdamW run on fp32 copies, and its
state dict round trip."""

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
