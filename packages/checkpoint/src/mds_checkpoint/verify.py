"""`--verify`: the source and the written model on one fixed batch on CPU, logits and loss.

Both are run as TP=1 `mds_model.GPT`s in fp32 on the same 2 x 32 token ids drawn uniformly at
random (seeded), not text; the logits of the real vocabulary are compared, and a difference above
fp32 rounding is an error: the output is not kept. The loss (next-token cross entropy over every
row of the padded vocabulary, as training computes it) is reported beside, and said to be on
random ids: on average no model scores below a uniform guess (ln of the vocabulary size) on them
and a trained one scores above, so it is no validation loss. Megatron trains the padding rows
and they take part in its softmax, so a written model whose padding differs (a Hugging Face
export has none) computes another loss from the same logits of the real vocabulary.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import torch
from mds_model import GPT

from .consolidate import ConsolidatedModel

logger = logging.getLogger(__name__)
BATCH, SEED = 2, 1234


@dataclass(frozen=True)
class Verification:
    logit_difference: float  # largest, over the real vocabulary
    source_loss: float
    written_loss: float
    batch_shape: tuple[int, int]  # of the random token ids both ran on

    def summary(self) -> str:
        same = self.written_loss == self.source_loss
        source = "the source's too" if same else f"the source's {self.source_loss:.6f}"
        rows, length = self.batch_shape
        return (
            f"largest logit difference {self.logit_difference:.3g}; loss on {rows} x {length} "
            f"random token ids (not text) {self.written_loss:.6f} ({source})"
        )


def logits_of(model: ConsolidatedModel, tokens: torch.Tensor) -> torch.Tensor:
    """Logits of the real vocabulary (the tokenizer's ids)."""
    return padded_logits(model, tokens)[..., : model.config.vocab_size]


def padded_logits(model: ConsolidatedModel, tokens: torch.Tensor) -> torch.Tensor:
    """Logits over every row of the model's padded vocabulary, as training's softmax sees them."""
    config = dataclasses.replace(
        model.config, params_dtype="float32", use_fused_kernels=False, hidden_dropout=0.0,
        attention_dropout=0.0, sequence_parallel=False,
    )  # fmt: skip
    gpt = GPT(config, init_seed=None)
    gpt.load_state_dict({name: t.float() for name, t in model.state_dict.items()})
    gpt.eval()
    with torch.no_grad():
        return gpt.logits(tokens)


def next_token_loss(logits: torch.Tensor, tokens: torch.Tensor) -> float:
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].flatten(0, 1).double(), tokens[:, 1:].flatten()
    ).item()


def fixed_batch(model: ConsolidatedModel) -> torch.Tensor:
    """BATCH rows of up to 32 token ids drawn uniformly from the real vocabulary (seeded)."""
    generator = torch.Generator().manual_seed(SEED)
    length = min(32, model.config.seq_length)
    return torch.randint(0, model.config.vocab_size, (BATCH, length), generator=generator)


def verify(source: ConsolidatedModel, target: ConsolidatedModel) -> Verification:
    """Logits and loss of both on the fixed batch; ValueError when the logits of the real
    vocabulary differ by more than fp32 rounding."""
    tokens = fixed_batch(source)
    source_logits, target_logits = padded_logits(source, tokens), padded_logits(target, tokens)
    vocab = source.config.vocab_size
    expected, actual = source_logits[..., :vocab], target_logits[..., :vocab]
    difference = (expected - actual).abs().max().item()
    scale = expected.abs().max().item()
    if not difference <= 1e-5 * max(scale, 1.0):
        raise ValueError(
            f"--verify: the written model's logits differ from the source's by {difference:.3g} "
            f"(largest logit {scale:.3g}); the output was not kept"
        )
    return Verification(
        logit_difference=difference,
        source_loss=next_token_loss(source_logits, tokens),
        written_loss=next_token_loss(target_logits, tokens),
        batch_shape=tuple(tokens.shape),
    )
