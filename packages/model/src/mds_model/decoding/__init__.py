"""Decoding for sampling, apart from the training module: `Decoder` runs a `GPT`'s parameters one
step at a time over its caches (`caches.py`: `KVCache`, `StaticKVCache`), and a step's products
pick the skinny Triton kernels where one row allows (`projections.py`). mds-generate's sampler
owns one.
"""

from .caches import KVCache, LayerKVCache, StaticKVCache, StaticLayerCache
from .decoder import Decoder

__all__ = ["Decoder", "KVCache", "LayerKVCache", "StaticKVCache", "StaticLayerCache"]
