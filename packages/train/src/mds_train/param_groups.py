"""Upstream's optimizer parameter groups, as its files record them."""

from __future__ import annotations

# The keys upstream's `get_param_groups` gives its two groups (megatron/optimizer/__init__.py):
# saved with the optimizer state, they are what its scheduler reads back on resume (a group
# without `wd_mult` would be decayed).
UPSTREAM_GROUP_KEYS = (
    {"name": "wd_no_scale_lr", "wd_mult": 1.0, "lr_mult": 1.0},
    {"name": "no_wd_no_scale_lr", "wd_mult": 0.0, "lr_mult": 1.0},
)

# Upstream's ZeRO-3 optimizer has one group, every parameter in module order: pretrain_gpt.py
# builds the model under `deepspeed.zero.Init`, so `get_param_groups` sees each parameter as a
# partitioned placeholder of shape (0,), which its `len(param.shape) == 1` test sends to the
# no-weight-decay group (and its scheduler then decays nothing). DeepSpeed's stage-3 load refuses
# a state dict of another group count, so ZeRO-3 partition files carry this grouping.
UPSTREAM_ZERO3_GROUP = {**UPSTREAM_GROUP_KEYS[1], "weight_decay": 0.0}
