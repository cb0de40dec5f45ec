"""The checkpoint layout of mds: read any TP/PP/DP layout, reshape it, export to Hugging Face.

Public API (README: "Python API"), the names every other package and tool imports: reading a
checkpoint (`load_consolidated`, `locate_checkpoint`, `open_source`, `UniversalState`,
`check_pt_file`), its schema (layout.py's file names, meta.json's `CheckpointMeta`), the namings
(`plain_parameter_name`, `megatron_flat`/`megatron_nested`), the conversion of upstream's
checkpoints (`reshape_checkpoint`, upstream's scheduler and keys) and the Hugging Face folder
reader. Everything else is internal; only this package and its tests import its modules.

The names load (and torch with them) on first use, so `mds-merge-mp --help` does not wait for
torch. A few are renamed where a module's own name would be ambiguous here (`CONFIG`, `FOLDER`,
`check`), or is the name of its submodule (`reshape`, which importing the submodule would rebind;
hence also `locate_checkpoint`).
"""

from importlib import import_module
from typing import TYPE_CHECKING

from mds_common.lazy import lazy_attributes

if TYPE_CHECKING:
    from .config import ReshapeConfig
    from .consolidate import ConsolidatedModel, load_consolidated
    from .describe import check_model_flags
    from .engine_names import megatron_flat, megatron_nested, plain_parameter_name
    from .flags import CheckedShapeFlags, LoadFlags
    from .hf_folder import CONFIG as HF_CONFIG
    from .hf_folder import (
        HFWeights,
        gpt_config_from_hf,
        hf_folder_tokenizer,
        is_hf_folder,
        read_hf_config,
        stored_dtype,
    )
    from .layout import (
        CLIENT_KEY,
        CLIENT_VERSION,
        DEEPSPEED_TAG,
        LATEST,
        LATEST_UNIVERSAL,
        MEGATRON_TRACKER,
        META,
        MP_RANK_FILE,
        PARTIAL_SUFFIX,
        ZERO_OPTIMIZER_FILE,
        fp8_file,
        rng_file,
        tag_for,
        zero3_model_file,
        zero_optimizer_file,
    )
    from .locate import Located, locate_checkpoint
    from .loss_scale import STATE_FIELDS as LOSS_SCALER_STATE_FIELDS
    from .meta import (
        MDS_LAYOUT,
        UPSTREAM_LAYOUT,
        CheckpointMeta,
        Parallel,
        Progress,
        meta_text,
        model_fields,
        read_meta,
    )
    from .ptfile import FOREIGN_CLASSES_PICKLE
    from .ptfile import check as check_pt_file
    from .reshape import reshape as reshape_checkpoint
    from .source import open_source
    from .universal import FOLDER as UNIVERSAL_FOLDER
    from .universal import GLOBAL_STATE as UNIVERSAL_GLOBAL_STATE
    from .universal import UniversalState, check_parameter_files, universal_meta
    from .upstream_state import scheduler_progress, upstream_keys

_LAZY = {
    "config": ("ReshapeConfig",),
    "consolidate": ("ConsolidatedModel", "load_consolidated"),
    "describe": ("check_model_flags",),
    "engine_names": ("megatron_flat", "megatron_nested", "plain_parameter_name"),
    "flags": ("CheckedShapeFlags", "LoadFlags"),
    "hf_folder": (
        "HFWeights",
        "gpt_config_from_hf",
        "hf_folder_tokenizer",
        "is_hf_folder",
        "read_hf_config",
        "stored_dtype",
    ),
    "layout": (
        "CLIENT_KEY",
        "CLIENT_VERSION",
        "DEEPSPEED_TAG",
        "LATEST",
        "LATEST_UNIVERSAL",
        "MEGATRON_TRACKER",
        "META",
        "MP_RANK_FILE",
        "PARTIAL_SUFFIX",
        "ZERO_OPTIMIZER_FILE",
        "fp8_file",
        "rng_file",
        "tag_for",
        "zero_optimizer_file",
        "zero3_model_file",
    ),
    "locate": ("Located", "locate_checkpoint"),
    "meta": (
        "MDS_LAYOUT",
        "UPSTREAM_LAYOUT",
        "CheckpointMeta",
        "Parallel",
        "Progress",
        "meta_text",
        "model_fields",
        "read_meta",
    ),
    "ptfile": ("FOREIGN_CLASSES_PICKLE",),
    "source": ("open_source",),
    "universal": ("UniversalState", "check_parameter_files", "universal_meta"),
    "upstream_state": ("scheduler_progress", "upstream_keys"),
}
_MODULE_OF = {name: module for module, names in _LAZY.items() for name in names}
# public name: (module, the module's name for it)
_RENAMED = {
    "HF_CONFIG": ("hf_folder", "CONFIG"),
    "LOSS_SCALER_STATE_FIELDS": ("loss_scale", "STATE_FIELDS"),
    "UNIVERSAL_FOLDER": ("universal", "FOLDER"),
    "UNIVERSAL_GLOBAL_STATE": ("universal", "GLOBAL_STATE"),
    "check_pt_file": ("ptfile", "check"),
    "reshape_checkpoint": ("reshape", "reshape"),
}

__all__ = [
    "CLIENT_KEY",
    "CLIENT_VERSION",
    "DEEPSPEED_TAG",
    "FOREIGN_CLASSES_PICKLE",
    "HF_CONFIG",
    "LATEST",
    "LATEST_UNIVERSAL",
    "LOSS_SCALER_STATE_FIELDS",
    "MDS_LAYOUT",
    "MEGATRON_TRACKER",
    "META",
    "MP_RANK_FILE",
    "PARTIAL_SUFFIX",
    "UNIVERSAL_FOLDER",
    "UNIVERSAL_GLOBAL_STATE",
    "UPSTREAM_LAYOUT",
    "ZERO_OPTIMIZER_FILE",
    "CheckedShapeFlags",
    "CheckpointMeta",
    "ConsolidatedModel",
    "HFWeights",
    "LoadFlags",
    "Located",
    "Parallel",
    "Progress",
    "ReshapeConfig",
    "UniversalState",
    "check_model_flags",
    "check_parameter_files",
    "check_pt_file",
    "fp8_file",
    "gpt_config_from_hf",
    "hf_folder_tokenizer",
    "is_hf_folder",
    "load_consolidated",
    "locate_checkpoint",
    "megatron_flat",
    "megatron_nested",
    "meta_text",
    "model_fields",
    "open_source",
    "plain_parameter_name",
    "read_hf_config",
    "read_meta",
    "reshape_checkpoint",
    "rng_file",
    "scheduler_progress",
    "stored_dtype",
    "tag_for",
    "universal_meta",
    "upstream_keys",
    "zero_optimizer_file",
    "zero3_model_file",
]


_lazy_getattr, _lazy_dir = lazy_attributes(__name__, _MODULE_OF)


def __getattr__(name: str) -> object:
    if name not in _RENAMED:
        return _lazy_getattr(name)
    module, original = _RENAMED[name]
    value = getattr(import_module(f".{module}", __name__), original)
    globals()[name] = value  # kept, as lazy_attributes keeps the others
    return value


def __dir__() -> list[str]:
    return sorted(set(_lazy_dir()) | set(_RENAMED))
