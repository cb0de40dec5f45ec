"""FP8 delayed scaling as Transformer Engine's `DelayedScaling` recipe defines it, which upstream
Megatron-DeepSpeed builds from its `--fp8-*` flags (megatron/model/transformer.py).

Every FP8 tensor of a linear (its input, its weight, the gradient of its output) is multiplied by
a scale before the cast, chosen from the largest magnitudes (amax) of that tensor in earlier steps:
scale = fp8_max / amax / 2**margin. The format sets which FP8 type each tensor takes. This module
imports torch only in `updated_scales`, so configs and flags can use the recipe without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# Transformer Engine's `Format`: E4M3 everywhere, or HYBRID (E4M3 forward, E5M2 gradients).
FORMATS = ("e4m3", "hybrid")
AMAX_COMPUTE_ALGOS = ("most_recent", "max")
E4M3_MAX = 448.0  # torch.float8_e4m3fn (OCP E4M3: no infinities, one NaN)
E5M2_MAX = 57344.0  # torch.float8_e5m2

# The tensors each FP8 linear scales, in this order along the last axis of its scaling state.
INPUT, WEIGHT, GRAD_OUTPUT = 0, 1, 2
NUM_ROLES = 3


@dataclass(frozen=True)
class Fp8Recipe:
    """fmt: "e4m3" (--fp8-e4m3) or "hybrid" (--fp8-hybrid). margin, interval, amax_history_len and
    amax_compute_algo as upstream's flags of those names; fp8_wgrad False (--no-fp8-wgrad) computes
    the weight gradient in the model's 16-bit dtype instead."""

    fmt: str
    margin: int = 0
    interval: int = 1
    amax_history_len: int = 1
    amax_compute_algo: str = "most_recent"
    fp8_wgrad: bool = True

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS:
            raise ValueError(f"FP8 format must be one of {', '.join(FORMATS)}; got {self.fmt!r}")
        if self.amax_compute_algo not in AMAX_COMPUTE_ALGOS:
            raise ValueError(
                f"--fp8-amax-compute-algo must be one of {', '.join(AMAX_COMPUTE_ALGOS)}; "
                f"got {self.amax_compute_algo!r}"
            )
        if self.interval < 1:
            raise ValueError(f"--fp8-interval must be 1 or more; got {self.interval}")
        if self.amax_history_len < 1:
            raise ValueError(
                f"--fp8-amax-history-len must be 1 or more; got {self.amax_history_len}"
            )
        if self.margin < 0:
            raise ValueError(f"--fp8-margin must be 0 or more; got {self.margin}")

    @property
    def forward_max(self) -> float:
        return E4M3_MAX

    @property
    def backward_max(self) -> float:
        return E5M2_MAX if self.fmt == "hybrid" else E4M3_MAX

    def dtypes(self) -> tuple[torch.dtype, torch.dtype]:
        """(forward, backward) FP8 dtypes: inputs and weights take the first, gradients the
        second."""
        import torch

        backward = torch.float8_e5m2 if self.fmt == "hybrid" else torch.float8_e4m3fn
        return torch.float8_e4m3fn, backward

    def role_maxima(self) -> tuple[float, float, float]:
        """The largest finite value of each role's FP8 type, in INPUT, WEIGHT, GRAD_OUTPUT order."""
        return self.forward_max, self.forward_max, self.backward_max

    def to_dict(self) -> dict:
        return {
            "format": self.fmt,
            "margin": self.margin,
            "interval": self.interval,
            "amax_history_len": self.amax_history_len,
            "amax_compute_algo": self.amax_compute_algo,
            "fp8_wgrad": self.fp8_wgrad,
        }


def updated_scales(
    history: torch.Tensor, scale: torch.Tensor, maxima: torch.Tensor, recipe: Fp8Recipe
) -> torch.Tensor:
    """The scales Transformer Engine's default `amax_and_scale_update` computes, on the device.

    history (L, ..., 3): amaxes with the most recent step first; scale (..., 3): the scales in
    use; maxima (3,): each role's FP8 maximum. A role whose amax is 0 or not finite (an fp16
    overflow step) keeps its scale; a scale past fp32's range becomes fp32's largest.
    """
    import torch

    amax = history[0] if recipe.amax_compute_algo == "most_recent" else history.amax(dim=0)
    new = maxima / amax / (2.0**recipe.margin)
    new = torch.where((amax > 0.0) & torch.isfinite(amax), new, scale)
    return torch.where(torch.isinf(new), torch.finfo(torch.float32).max, new)


# _scaled_mm's FP8 GEMMs need FP8 tensor cores: Ada (8.9), Hopper (9.0) and later.
MIN_CAPABILITY = (8, 9)


def device_problem() -> str | None:
    """Why this machine cannot train in FP8, or None: no GPU, or one without FP8 tensor cores."""
    import torch

    if not torch.cuda.is_available():
        return (
            "FP8 training needs a GPU with FP8 tensor cores (Hopper or Ada, compute capability "
            "8.9 or newer); there is none here: drop the --fp8-* flags"
        )
    capability = torch.cuda.get_device_capability()
    if capability < MIN_CAPABILITY:
        name = torch.cuda.get_device_name()
        return (
            f"FP8 training needs a GPU with FP8 tensor cores (compute capability 8.9 or newer); "
            f"{name} is {capability[0]}.{capability[1]}: drop the --fp8-* flags"
        )
    return None
