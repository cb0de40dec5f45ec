"""FP8 training for mds_model's tensor-parallel linears, with Transformer Engine's delayed scaling
behind upstream Megatron-DeepSpeed's `--fp8-*` flags; `torch._scaled_mm` and a Triton cast, so
nothing needs a CUDA build. The recipe loads without torch; the layers on first use."""

from typing import TYPE_CHECKING

from mds_common.lazy import lazy_attributes

from .recipe import AMAX_COMPUTE_ALGOS, FORMATS, Fp8Recipe

if TYPE_CHECKING:
    from .training import Fp8Training, enable_fp8

__getattr__, __dir__ = lazy_attributes(
    __name__, {"Fp8Training": "training", "enable_fp8": "training"}
)

__all__ = ["AMAX_COMPUTE_ALGOS", "FORMATS", "Fp8Recipe", "Fp8Training", "enable_fp8"]
