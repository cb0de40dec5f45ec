"""From `--load PATH` to a model ready to decode on one device, and its tokenizer.

PATH is an mds or upstream checkpoint of any TP/PP layout (read whole by
`mds_checkpoint.load_consolidated`: its `meta.json` or Megatron's args give the model, so no model
flags are needed) or a Hugging Face GPT-2, Llama, GPT-NeoX or BLOOM folder (its family's adapter,
`mds_model.hf_families`).
The tokenizer (mds_tokenize's one interface: GPT-2 BPE files, a learned vocabulary or a Hugging
Face tokenizer.json) comes from the tokenizer flags, else from the checkpoint (meta.json's
`tokenizer`, or the HF folder's tokenizer.json or vocab.json + merges.txt), and must be the one
the model was trained with.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from mds_checkpoint import HF_CONFIG as CONFIG
from mds_checkpoint import (
    HFWeights,
    check_model_flags,
    gpt_config_from_hf,
    hf_folder_tokenizer,
    is_hf_folder,
    read_hf_config,
    stored_dtype,
)
from mds_common.tokenizer_record import TokenizerRecord
from mds_model import GPT, GPTConfig, hf_adapter, hf_adapter_of_folder
from mds_model.kernels import triton_available
from mds_tokenize.interface import (
    Tokenizer,
    TokenizerSpec,
    check_checkpoint_tokenizer,
    load_tokenizer,
    spec_from_record,
)

from .config import ModelSource

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedModel:
    model: GPT  # eval mode, on `device`, in the run's dtype
    tokenizer: Tokenizer
    device: torch.device
    kind: str  # "mds" (an mds or upstream checkpoint) or "hf"
    # An mds checkpoint's description (mds_checkpoint.meta.CheckpointMeta); None for a Hugging
    # Face folder.
    meta: Any
    inputs: tuple[Path, ...]  # what was read: the checkpoint, the tokenizer's files
    # Ids the tokenizer has (its embedding rows), what sampling draws from: the model's
    # vocab_size, or fewer for a Hugging Face folder whose embedding holds more rows than its
    # tokenizer has ids (Pythia's 50304 for 50277, BLOOM's 250880 for 250680).
    num_ids: int


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: no CUDA device here; use --device cpu")
    return device


def run_dtype(requested: str, stored: str | None, device: torch.device) -> str:
    """auto: float32 on CPU; on a GPU the checkpoint's own half precision, else bfloat16."""
    if requested != "auto":
        return requested
    if device.type != "cuda":
        return "float32"
    return stored if stored in ("bfloat16", "float16") else "bfloat16"


def inference_config(config: GPTConfig, *, dtype: str, device: torch.device) -> GPTConfig:
    """The same model as run here: one device, no dropout, Triton kernels on CUDA only."""
    backend = config.attention_backend
    return dataclasses.replace(
        config,
        sequence_parallel=False,
        activation_checkpointing="none",
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=dtype,
        use_fused_kernels=device.type == "cuda" and triton_available(),
        attention_backend="auto" if backend == "flash" else backend,
    )


def _read_checkpoint(source: ModelSource):
    path = source.load
    if not path.exists():
        raise ValueError(f"--load {path}: no such checkpoint folder")
    if is_hf_folder(path):
        config, state_dict, dtype = _read_hf_folder(path)
        return "hf", config, state_dict, None, dtype
    try:
        from mds_checkpoint import load_consolidated
    except ImportError:  # pragma: no cover - a broken install
        raise ValueError("reading mds checkpoints needs the mds-checkpoint package") from None
    whole = load_consolidated(path, iteration=source.iteration)
    return "mds", whole.config, whole.state_dict, whole.meta, whole.meta.precision


def _read_hf_folder(path: Path) -> tuple[GPTConfig, dict[str, torch.Tensor], str | None]:
    """(config, our plain GPT state dict, stored dtype name or None), through the adapter of the
    folder's family (config.json's model_type)."""
    hf = read_hf_config(path)  # checks that an adapter reads it
    adapter = hf_adapter_of_folder(hf)
    try:
        config = gpt_config_from_hf(hf)
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{path / CONFIG}: {error}") from None
    # read a tensor at a time as the conversion asks, under the names the adapter reads
    weights = HFWeights(path, adapter.model_type)
    try:
        state_dict = adapter.from_hf(weights, config)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
    return config, state_dict, stored_dtype(hf)


def describe(config: GPTConfig, kind: str, meta: Any) -> str:
    """What the log line calls the model: its family (the Hugging Face family that holds it, else
    "GPT") and where it came from."""
    try:
        family = hf_adapter(config).display
    except ValueError:  # a layout no transformers family holds (mds-train builds such GPTs)
        family = "GPT"
    if kind == "hf":
        return f"{family} Hugging Face folder"
    # upstream's files carry no meta.json: their description comes from Megatron's args
    return f"{family} {'upstream' if meta.tool is None else 'mds'} checkpoint"


TOKENIZER_FLAGS = (
    "--vocab-file and --merge-file, --tokenizer-name-or-path, or --tokenizer-type with "
    "--tokenizer-model"
)


def tokenizer_spec(source: ModelSource, kind: str, recorded: TokenizerRecord) -> TokenizerSpec:
    """The flags' tokenizer, else the one the checkpoint names: a Hugging Face folder's
    tokenizer.json (else its vocab.json + merges.txt), an mds checkpoint's meta.json `tokenizer`."""
    if source.tokenizer is not None:
        return source.tokenizer
    if kind == "hf":
        spec = _hf_folder_tokenizer(source.load)
    else:
        spec = _recorded_tokenizer(source.load, recorded)
    if source.tokenizer_type not in (None, spec.tokenizer_type):
        raise ValueError(
            f"--tokenizer-type {source.tokenizer_type}, but {source.load} was trained with a "
            f"{spec.tokenizer_type} tokenizer; drop the flag or pass the tokenizer's files too"
        )
    return spec


def _hf_folder_tokenizer(folder: Path) -> TokenizerSpec:
    recorded = hf_folder_tokenizer(folder)
    if not recorded:
        raise ValueError(
            f"--load {folder}: the folder has no tokenizer.json, nor vocab.json and merges.txt; "
            f"pass {TOKENIZER_FLAGS}"
        )
    return spec_from_record(recorded)


def _recorded_tokenizer(load: Path, recorded: TokenizerRecord) -> TokenizerSpec:
    for file in recorded.files:
        if file and not Path(file).is_file():
            raise ValueError(
                f"{file}: no such file (the tokenizer the checkpoint's meta.json names); "
                f"pass {TOKENIZER_FLAGS}"
            )
    try:
        return spec_from_record(recorded)
    except ValueError:
        raise ValueError(
            f"--load {load}: the checkpoint names no tokenizer files; pass {TOKENIZER_FLAGS}"
        ) from None


def tokenizer_name(spec: TokenizerSpec) -> str:
    """What error lines call the tokenizer: its vocabulary file or its tokenizer.json's place."""
    return str(spec.tokenizer_name_or_path or spec.tokenizer_model or spec.vocab_file)


def check_vocabulary(
    tokenizer: Tokenizer,
    config: GPTConfig,
    recorded: TokenizerRecord,
    *,
    name: str,
    compare_files: str | None,
    padded_rows: bool = False,
) -> None:
    """The tokenizer is the one the model was trained with: the same number of ids as the model
    has, and `check_checkpoint_tokenizer` against `recorded` (meta.json's `tokenizer`: its EOD,
    size and files by content). `compare_files` names the checkpoint where the flags named the
    tokenizer; without them it was read from the files `recorded` names. `padded_rows`: the
    model may have more rows than the tokenizer has ids (a Hugging Face folder's config.json
    counts its embedding's rows, which transformers pads past the tokenizer's)."""
    given = tokenizer.record()
    size = given.embedding_rows()  # as mds-train sizes the model
    # a Hugging Face folder's extra embedding rows are never sampled (LoadedModel.num_ids)
    if size != config.vocab_size and not (padded_rows and size < config.vocab_size):
        raise ValueError(
            f"{name}: {size} tokens, but the checkpoint's model was trained with a vocabulary of "
            f"{config.vocab_size}; pass the tokenizer it was trained with ({TOKENIZER_FLAGS})"
        )
    check_checkpoint_tokenizer(recorded, given, checkpoint=compare_files or name)


def load(source: ModelSource) -> LoadedModel:
    device = resolve_device(source.device)
    kind, config, state_dict, meta, saved_dtype = _read_checkpoint(source)
    check_model_flags(config, source.expected_shape)
    recorded = (meta.tokenizer if meta is not None else None) or TokenizerRecord()
    spec = tokenizer_spec(source, kind, recorded)
    tokenizer = load_tokenizer(spec)
    check_vocabulary(
        tokenizer,
        config,
        recorded,
        name=tokenizer_name(spec),
        compare_files=None if source.tokenizer is None else f"--load {source.load}",
        padded_rows=kind == "hf",
    )
    dtype = run_dtype(source.dtype, saved_dtype, device)
    config = inference_config(config, dtype=dtype, device=device)
    model = GPT(config, init_seed=None)
    result = model.load_state_dict(
        {name: tensor.to(config.torch_dtype) for name, tensor in state_dict.items()}, strict=False
    )
    if result.missing_keys or result.unexpected_keys:
        names = result.missing_keys or result.unexpected_keys
        what = "lacks" if result.missing_keys else "has unexpected"
        raise ValueError(f"--load {source.load}: the checkpoint {what} {', '.join(names[:3])}")
    model = model.to(device).eval()
    logger.info(
        "loaded %s (%s, %d layers, hidden %d, %s on %s)",
        source.load,
        describe(config, kind, meta),
        config.num_layers,
        config.hidden_size,
        dtype,
        device,
    )
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        device=device,
        kind=kind,
        meta=meta,
        inputs=(source.load, *tokenizer.files),
        num_ids=min(tokenizer.record().embedding_rows(), config.vocab_size),
    )
