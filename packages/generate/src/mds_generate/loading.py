"""From `--load PATH` to a model ready to decode on one device, and its tokenizer.

PATH is an mds checkpoint of any TP/PP layout (read whole by `mds_checkpoint.load_consolidated`:
its `meta.json` gives the model, so no model flags are needed) or a Hugging Face GPT-2 folder.
The vocabulary comes from `--vocab-file/--merge-file`, else from the checkpoint (meta.json's
`tokenizer`, or the HF folder's `vocab.json` + `merges.txt`), and must be the one it was trained
with.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from mds_checkpoint.hf_folder import (
    CONFIG,
    gpt_config_from_hf,
    hf_tokenizer_files,
    is_hf_folder,
    read_hf_config,
    read_hf_weights,
    stored_dtype,
)
from mds_model import GPT, GPTConfig, from_hf_gpt2_state_dict
from mds_model.kernels import triton_available

from .config import ModelSource
from .tokenizer import Tokenizer, build_tokenizer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedModel:
    model: GPT  # eval mode, on `device`, in the run's dtype
    tokenizer: Tokenizer
    device: torch.device
    kind: str  # "mds" or "hf"
    meta: dict[str, Any]  # an mds checkpoint's meta.json ({} for a Hugging Face folder)
    inputs: tuple[Path, ...]  # what was read: the checkpoint, the vocabulary files


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
        tensor_model_parallel_size=1,
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
        return "hf", config, state_dict, {}, dtype
    try:
        from mds_checkpoint import load_consolidated
    except ImportError:  # pragma: no cover - a broken install
        raise ValueError("reading mds checkpoints needs the mds-checkpoint package") from None
    whole = load_consolidated(path, iteration=source.iteration)
    return "mds", whole.config, whole.state_dict, whole.meta, whole.meta.get("precision")


def _read_hf_folder(path: Path) -> tuple[GPTConfig, dict[str, torch.Tensor], str | None]:
    """(config, our plain GPT state dict, stored dtype name or None)."""
    hf = read_hf_config(path)
    try:
        config = gpt_config_from_hf(hf)
    except ValueError as error:
        raise ValueError(f"{path / CONFIG}: {error}") from None
    weights = read_hf_weights(path)
    try:
        state_dict = from_hf_gpt2_state_dict(weights, config)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
    return config, state_dict, stored_dtype(hf)


def tokenizer_files(source: ModelSource, kind: str, meta: dict) -> tuple[Path, Path]:
    if source.vocab_file is not None:
        return source.vocab_file, source.merge_file
    if kind == "hf":
        files = hf_tokenizer_files(source.load)
        if files is None:
            raise ValueError(
                f"--load {source.load}: the folder has no vocab.json and merges.txt; pass "
                "--vocab-file and --merge-file"
            )
        return files
    recorded = meta.get("tokenizer") or {}
    vocab, merges = recorded.get("vocab_file"), recorded.get("merge_file")
    if not vocab or not merges:
        raise ValueError(
            f"--load {source.load}: the checkpoint names no vocabulary files; pass --vocab-file "
            "and --merge-file"
        )
    for name in (vocab, merges):
        if not Path(name).is_file():
            raise ValueError(
                f"{name}: no such file (the vocabulary the checkpoint's meta.json names); pass "
                "--vocab-file and --merge-file"
            )
    return Path(vocab), Path(merges)


def check_vocabulary(
    tokenizer: Tokenizer, config: GPTConfig, meta: dict, *, vocab_file: Path
) -> None:
    if tokenizer.vocab_size != config.vocab_size:
        raise ValueError(
            f"{vocab_file}: {tokenizer.vocab_size} tokens, but the checkpoint's model was "
            f"trained with a vocabulary of {config.vocab_size}; pass the vocabulary it was "
            "trained with (--vocab-file, --merge-file)"
        )
    recorded = (meta.get("tokenizer") or {}).get("eod_id")
    if recorded is not None and recorded != tokenizer.eod:
        raise ValueError(
            f"{vocab_file}: end-of-document is id {tokenizer.eod}, the checkpoint's vocabulary "
            f"had {recorded}; pass the vocabulary it was trained with"
        )


def check_shape(config: GPTConfig, expected: tuple[tuple[str, int], ...]) -> None:
    """Model flags of an old command line must describe the checkpoint's model."""
    for name, value in expected:
        actual = (
            config.max_positions if name == "max_position_embeddings" else getattr(config, name)
        )
        if value != actual:
            flag = "--" + name.replace("_", "-")
            raise ValueError(
                f"{flag} {value}, but the checkpoint's model has {actual}; drop the flag (the "
                "checkpoint says its shape)"
            )


def load(source: ModelSource) -> LoadedModel:
    device = resolve_device(source.device)
    kind, config, state_dict, meta, saved_dtype = _read_checkpoint(source)
    check_shape(config, source.expected_shape)
    vocab_file, merge_file = tokenizer_files(source, kind, meta)
    tokenizer = build_tokenizer(vocab_file, merge_file)
    check_vocabulary(tokenizer, config, meta, vocab_file=vocab_file)
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
        "Hugging Face GPT-2" if kind == "hf" else "mds checkpoint",
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
        inputs=(source.load, vocab_file, merge_file),
    )
