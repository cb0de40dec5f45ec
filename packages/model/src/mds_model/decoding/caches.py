"""The decoding caches of `Decoder`: `KVCache` grows by concatenation (`Decoder.decode`);
`StaticKVCache` is preallocated with per-row positions (`Decoder.decode_static_hidden`: ragged
batches, CUDA graphs). Keys and values are (B, groups/TP, S, head_dim), as attention reads them
(groups: the heads, without grouped-query attention).
"""

from __future__ import annotations

import torch

from ..config import GPTConfig


class LayerKVCache:
    """One layer's keys and values of the positions decoded so far, each (B, heads/TP, S, hd)."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    @property
    def num_positions(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def extend(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Appends the new positions' keys and values; returns all of them, past and new."""
        if self.keys is not None:
            keys = torch.cat((self.keys, keys), dim=2)
            values = torch.cat((self.values, values), dim=2)
        self.keys, self.values = keys, values
        return keys, values


class KVCache:
    """The whole model's cache for `Decoder.decode`: one `LayerKVCache` per transformer layer.

    Starts empty; each decode call appends its tokens' keys and values, and the next call's
    positions continue at `num_positions`.
    """

    def __init__(self, num_layers: int) -> None:
        self.layers = [LayerKVCache() for _ in range(num_layers)]

    @property
    def num_positions(self) -> int:
        return self.layers[0].num_positions if self.layers else 0


class StaticLayerCache:
    """One layer's preallocated keys and values, `kv` (2, B, heads/TP, max_length, head_dim);
    `keys` and `values` are its two halves.

    Row b's token at position p lives in slot p (per-row positions, no left padding): a batch
    of prompts of different lengths is right-padded, and each row writes and reads its own slots.
    Writes are in place (shapes never change: CUDA graphs can replay them).
    """

    def __init__(self, kv: torch.Tensor) -> None:
        self.kv = kv
        self.keys, self.values = kv[0], kv[1]

    def write(
        self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Stores keys, values (B, nh, S_new, hd) at the slots `positions` (B, S_new); returns the
        whole keys and values (B, nh, max_length, hd)."""
        return self.write_kv(torch.stack((keys, values)), positions)

    def write_kv(
        self, kv: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`write` of keys and values stacked as kv (2, B, nh, S_new, hd) (any strides, such as a
        view of the QKV projection): one scatter for both."""
        index = positions[None, :, None, :, None].expand_as(kv)
        self.kv.scatter_(3, index, kv.to(self.kv.dtype))
        return self.keys, self.values


class StaticKVCache:
    """The whole model's preallocated cache for `Decoder.decode_static_hidden`: one
    `StaticLayerCache` per layer, `batch_size` rows of `max_length` positions, allocated once (a
    fixed memory address for CUDA graphs and torch.compile).

    A query at position p sees the slots 0..p of its row (`visibility`): slots past a row's
    prompt hold padding or the last call's tokens until that row writes them, and are never
    read before.
    """

    def __init__(
        self,
        config: GPTConfig,
        *,
        batch_size: int,
        max_length: int,
        tensor_parallel_size: int = 1,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        if not 1 <= max_length <= config.max_positions:
            raise ValueError(
                f"max_length must be in 1..{config.max_positions} (max_position_embeddings), "
                f"got {max_length}"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        shape = (
            2,
            batch_size,
            config.query_groups // tensor_parallel_size,  # grouped-query attention: the groups'
            max_length,
            config.head_dim,
        )
        dtype = dtype or config.torch_dtype
        self.batch_size, self.max_length, self.dtype = batch_size, max_length, dtype
        self.layers = [
            StaticLayerCache(torch.zeros(shape, device=device, dtype=dtype))
            for _ in range(config.num_layers)
        ]
        self._slots = torch.arange(max_length, device=device)

    def visibility(self, positions: torch.Tensor, *, num_slots: int | None = None) -> torch.Tensor:
        """positions (B, S_new) -> attention mask (B, 1, S_new, num_slots or max_length):
        slot <= position."""
        slots = self._slots if num_slots is None else self._slots[:num_slots]
        return slots.view(1, 1, 1, -1) <= positions[:, None, :, None]

    def attention_bias(
        self, positions: torch.Tensor, *, num_slots: int | None = None
    ) -> torch.Tensor:
        """`visibility` as an additive mask in the cache's dtype (0 where seen, -inf elsewhere),
        built once per step for every layer (a boolean mask is converted again by each call).
        Its last dimension says how many slots the attention reads
        (`Decoder.decode_static_hidden`'s num_slots)."""
        if num_slots is not None and not 1 <= num_slots <= self.max_length:
            raise ValueError(f"num_slots must be in 1..{self.max_length}, got {num_slots}")
        visible = self.visibility(positions, num_slots=num_slots)
        bias = torch.zeros(visible.shape, dtype=self.dtype, device=positions.device)
        return bias.masked_fill_(~visible, float("-inf"))
