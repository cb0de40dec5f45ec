"""`--verify`: the source and the written model on one fixed batch on CPU, logits compared.

Both are run as TP=1 `mds_model.GPT`s in fp32 on the same 2 x 32 tokens (seeded); the logits of
the real vocabulary are compared (padding rows may legitimately differ when TP changes the
padded size). A difference above fp32 rounding is an error: the output is not kept.
"""

from __future__ import annotations

import dataclasses
import logging

import torch
from mds_model import GPT

from .consolidate import ConsolidatedModel

logger = logging.getLogger(__name__)
BATCH, SEED = 2, 1234


def logits_of(model: ConsolidatedModel, tokens: torch.Tensor) -> torch.Tensor:
    config = dataclasses.replace(
        model.config, params_dtype="float32", use_fused_kernels=False, hidden_dropout=0.0,
        attention_dropout=0.0, sequence_parallel=False,
    )  # fmt: skip
    gpt = GPT(config, init_seed=None)
    gpt.load_state_dict({name: t.float() for name, t in model.state_dict.items()})
    gpt.eval()
    with torch.no_grad():
        return gpt.logits(tokens)[..., : config.vocab_size]


def fixed_batch(model: ConsolidatedModel) -> torch.Tensor:
    generator = torch.Generator().manual_seed(SEED)
    length = min(32, model.config.seq_length)
    return torch.randint(0, model.config.vocab_size, (BATCH, length), generator=generator)


def check_logits(source: ConsolidatedModel, target: ConsolidatedModel) -> float:
    """The largest absolute logit difference; ValueError when it exceeds fp32 rounding."""
    tokens = fixed_batch(source)
    expected, actual = logits_of(source, tokens), logits_of(target, tokens)
    difference = (expected - actual).abs().max().item()
    scale = expected.abs().max().item()
    if not difference <= 1e-5 * max(scale, 1.0):
        raise ValueError(
            f"--verify: the written model's logits differ from the source's by {difference:.3g} "
            f"(largest logit {scale:.3g}); the output was not kept"
        )
    return difference
