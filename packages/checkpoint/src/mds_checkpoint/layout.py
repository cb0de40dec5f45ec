"""The names of a checkpoint's files and folders, as each writer gives them: one place for every
reader and writer (mds-train's saves, mds-merge-mp's outputs, the loaders). Torch-free.

A save folder holds a pointer and one folder per checkpoint:
- DeepSpeed (mds-train, Megatron-DeepSpeed): `latest` names `global_stepN`, which holds
  `mp_rank_TT_model_states.pt` (the plain engine's module and client state, one per TP rank, or
  per (stage, TP rank) beside a pipeline's layer files), `layer_XX-model_TT-model_states.pt`
  (the pipeline engine), DeepSpeed's ZeRO partitions, mds-train's `rng_state_rankRRRRR.pt` (and
  `fp8_scaling_rankRRRRR.pt` in FP8 runs) and `meta.json` (`meta.py`).
- Megatron: `latest_checkpointed_iteration.txt` holds N (or `release`), naming `iter_NNNNNNN`
  (or `release`), which holds `mp_rank_TT[_PPP]/model_optim_rng.pt`. deepspeedai's
  Megatron-DeepSpeed writes this tracker beside DeepSpeed's `latest`.
mds-train writes a checkpoint as `global_stepN.partial` and renames it into place before `latest`
names it.
"""

from __future__ import annotations

import re

from mds_model.naming import LAYER_FILE  # noqa: F401 - the pipeline's files, named with its numbering

LATEST = "latest"
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
LATEST_UNIVERSAL = "latest_universal"  # DeepSpeed's pointer for load_universal (engine.py)
MEGATRON_RELEASE = "release"  # Megatron's tag of a checkpoint at no iteration
MEGATRON_FILE = "model_optim_rng.pt"
META = "meta.json"
PARTIAL_SUFFIX = ".partial"
DEEPSPEED_TAG = re.compile(r"global_step(\d+)")
MEGATRON_TAG = re.compile(r"iter_(\d{7,})")
MP_RANK_FILE = re.compile(r"mp_rank_(\d+)_model_states\.pt")
ZERO3_MODEL_FILE = re.compile(r"zero_pp_rank_(\d+)_mp_rank_(\d+)_model_states\.pt")
# DeepSpeed's ZeRO partitions of DP rank D: ZeRO-1/2 and BF16 (`bf16_`) optimizer state, and at
# ZeRO-3 the fp32 weights too.
ZERO_OPTIMIZER_FILE = re.compile(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt")


def zero_optimizer_file(dp_rank: int | str, mp_rank: int, *, bf16: bool) -> str:
    """DeepSpeed's name for one partition of ZeRO optimizer state (`_get_rank_zero_ckpt_name`;
    `bf16_` when its engine runs bf16), which ZERO_OPTIMIZER_FILE matches."""
    return f"{'bf16_' if bf16 else ''}zero_pp_rank_{dp_rank}_mp_rank_{mp_rank:02d}_optim_states.pt"


def zero3_model_file(dp_rank: int, mp_rank: int) -> str:
    """DeepSpeed's name for one data-parallel rank's model file at ZeRO-3 (`_get_ckpt_name`),
    which ZERO3_MODEL_FILE matches."""
    return f"zero_pp_rank_{dp_rank}_mp_rank_{mp_rank:02d}_model_states.pt"


MEGATRON_RANK_DIR = re.compile(r"mp_rank_(\d+)(?:_(\d+))?")
# mds-train's progress record in DeepSpeed's client state (mp_rank files), and its version.
CLIENT_KEY = "mds_train"
CLIENT_VERSION = 1


def tag_for(iteration: int, layout: str = "mds") -> str:
    """The checkpoint folder's name: DeepSpeed's `global_stepN`; Megatron's `iter_NNNNNNN`, or
    `release` at iteration 0 (its `read_metadata` takes no iteration 0)."""
    if layout == "megatron":
        return MEGATRON_RELEASE if iteration == 0 else f"iter_{iteration:07d}"
    return f"global_step{iteration}"


def tag_iteration(tag: str) -> int | None:
    """The iteration a checkpoint folder's name says (`global_stepN`, `iter_NNNNNNN`), else None."""
    match = DEEPSPEED_TAG.fullmatch(tag) or MEGATRON_TAG.fullmatch(tag)
    return None if match is None else int(match.group(1))


def tracker_tag(text: str) -> str:
    """The folder Megatron's tracker file names: `iter_NNNNNNN` for a number, else as written."""
    return tag_for(int(text), "megatron") if text.isdigit() else text


def fp8_file(rank: int) -> str:
    """mds-train's FP8 scaling state of one global rank (amaxes, their history, the scales), saved
    by runs with --fp8-e4m3/--fp8-hybrid."""
    return f"fp8_scaling_rank{rank:05d}.pt"


def rng_file(rank: int) -> str:
    """mds-train's RNG states of one global rank (Python, numpy, torch, the TP tracker)."""
    return f"rng_state_rank{rank:05d}.pt"
