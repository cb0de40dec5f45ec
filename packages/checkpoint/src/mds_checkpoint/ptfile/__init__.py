"""Reading and writing `torch.save` files (torch >= 1.6's zip format) without torch.

Tensors are numpy arrays (`..arrays`), memory-mapped when read; classes of other programs
(DeepSpeed's loss scalers and fragment addresses, Megatron's enums) become `Missing` records
without importing their modules. mds-merge-mp reads and writes checkpoints through this, so it
never pays torch's import (1.5-2.5 s, as long as a 345M reshape's own work). The format is
described in `format.py`.
"""

from .format import Missing
from .read import FOREIGN_CLASSES_PICKLE, check, load
from .write import GlobalName, SavedTensor, StreamingSave, save

__all__ = [
    "FOREIGN_CLASSES_PICKLE",
    "GlobalName",
    "Missing",
    "SavedTensor",
    "StreamingSave",
    "check",
    "load",
    "save",
]
