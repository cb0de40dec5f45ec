"""The LM head of CPU decoding (`GPT.head_weight`: the untied output layer, or the tied word
embeddings), with the weight copied into the layouts that the CPU's fp32 matrix products read
fastest: the same logits as `hidden @ weight[:V].T`.

`F.linear` over the (V, H) weight makes MKL run a transposed matrix-vector product that
reads the 51 MB of GPT-2's fp32 head at a third of the copy bandwidth (6.5 ms per step at one
row, on the 2-core AMD EPYC of benchmarks/generate.py); over a contiguous (H, V) copy the same
product streams it (2.2 ms). From 4 rows on, the copy is cut into (H, 128) column blocks, one
batched product: each block is read from memory once and stays in cache for all the rows
(7.5 ms at 8 rows against 16 for `F.linear` and 10 for one product over the (H, V) copy).
Columns past the vocabulary (Megatron's padding rows) are left out: they are never sampled.
`greedy` fuses the argmax for plain greedy decoding: over the blocks, the largest logit of each
block, then the first block holding the row's largest and the first position in it (torch's
argmax: the first maximum), so the blocks are never copied into one (B, V) tensor (1.6 ms at 8
rows) nor scanned by argmax (0.45 ms).
"""

from __future__ import annotations

import torch

BLOCK = 128  # columns per block: (H=256, 128) fp32 is 128 KB, in L2 beside its rows
MIN_BLOCKED_ROWS = 4  # from this many rows on the blocked product is the faster


class CpuLmHead:
    """hidden (B, H) -> logits (B, vocab_size) over `weight` (padded V, H: the model's
    `head_weight`), which stays the model's own tensor; the copies are made when first needed and
    made again when the weight changes in place (its version counter moves, e.g.
    `load_state_dict`)."""

    def __init__(self, weight: torch.Tensor, *, vocab_size: int) -> None:
        if weight.device.type != "cpu":
            raise ValueError("CpuLmHead is for CPU decoding")
        self.weight, self.vocab_size = weight, vocab_size
        self._columns: torch.Tensor | None = None  # (H, V) contiguous
        self._blocks: torch.Tensor | None = None  # (ceil(V / BLOCK), H, BLOCK), zero-padded
        self._version = weight._version

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        if hidden.shape[0] < MIN_BLOCKED_ROWS:
            return torch.mm(hidden, self._columns_layout())
        blocked = self._blocked_logits(hidden)  # (nb, B, BLOCK)
        return blocked.transpose(0, 1).reshape(hidden.shape[0], -1)[:, : self.vocab_size]

    def greedy(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (B, H) -> the argmax of each row's logits (B,) int64, ties to the first."""
        rows = hidden.shape[0]
        if rows < MIN_BLOCKED_ROWS:
            return torch.mm(hidden, self._columns_layout()).argmax(dim=-1)
        blocked = self._blocked_logits(hidden)
        blocked[-1, :, self.vocab_size - (blocked.shape[0] - 1) * BLOCK :] = float("-inf")
        block = blocked.amax(dim=-1).argmax(dim=0)  # (B,): the first block with the row's max
        within = blocked[block, torch.arange(rows)].argmax(dim=-1)  # (B,)
        return block * BLOCK + within

    def _blocked_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        blocks = self._blocks_layout()
        return torch.bmm(hidden.expand(blocks.shape[0], *hidden.shape), blocks)

    def _check_version(self) -> None:
        if self.weight._version != self._version:
            self._columns = self._blocks = None
            self._version = self.weight._version

    def _columns_layout(self) -> torch.Tensor:
        self._check_version()
        if self._columns is None:
            weight = self.weight.detach()[: self.vocab_size]
            self._columns = weight.t().contiguous()
        return self._columns

    def _blocks_layout(self) -> torch.Tensor:
        self._check_version()
        if self._blocks is None:
            vocab, hidden = self.vocab_size, self.weight.shape[1]
            num_blocks = -(-vocab // BLOCK)
            padded = self.weight.new_zeros(num_blocks * BLOCK, hidden)
            padded[:vocab] = self.weight.detach()[:vocab]
            self._blocks = padded.view(num_blocks, BLOCK, hidden).transpose(1, 2).contiguous()
        return self._blocks
