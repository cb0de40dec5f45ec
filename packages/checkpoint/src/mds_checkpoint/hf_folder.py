"""Reading a Hugging Face folder without `transformers`: `config.json`, the GPTConfig it describes
(by its family's adapter, `mds_model.hf_families`: GPT-2, Llama, GPT-NeoX, BLOOM), and the weights
(`model.safetensors`, a sharded `model.safetensors.index.json`, or `pytorch_model.bin`). The one
reader behind import-hf, export-hf's check and mds-generate.

GPT-2 and BLOOM names are read with or without the `transformer.` prefix (OpenAI's `gpt2` and
bigscience's `bloom-560m` on the Hub have none); GPT-2's attention-mask buffers and tied
`lm_head.weight` of older files are skipped.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from mds_common.tokenizer_record import (
    GPT2_BPE,
    GPT_SENTENCEPIECE,
    HF_TOKENIZER,
    PRETRAINED_FROM_HF,
    SENTENCEPIECE,
    TokenizerRecord,
)
from mds_model import GPTConfig
from mds_model.hf_families import hf_adapter_of_folder
from mds_model.parameters import BLOOM_HF, GPT2_HF

from . import safetensors_file
from .arrays import as_tensor
from .layout import LATEST

CONFIG = "config.json"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_BIN = "pytorch_model.bin"
_DTYPES = ("float32", "bfloat16", "float16")


def is_hf_folder(path: Path) -> bool:
    """A `config.json` with a `model_type`, or beside Hugging Face weights; mds-train's save
    folder has a `config.json` of its own (the run's flags), next to `latest`."""
    if not (path / CONFIG).is_file() or (path / LATEST).is_file():
        return False
    if any((path / name).is_file() for name in (SAFETENSORS, SAFETENSORS_INDEX, TORCH_BIN)):
        return True
    try:
        return "model_type" in json.loads((path / CONFIG).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False


def is_hf_model_folder(path: Path) -> bool:
    """A Hugging Face model folder: config.json beside its weights."""
    weights = (SAFETENSORS, SAFETENSORS_INDEX, TORCH_BIN)
    return (path / CONFIG).is_file() and any((path / name).is_file() for name in weights)


def missing_config(path: Path) -> str | None:
    """The one line for a folder of Hugging Face files (weights, or a tokenizer only) without
    `config.json`, as a download or copy that left it behind is; None when the folder has a
    config.json or no such files. The tools tell a Hugging Face folder by its config.json: without
    this line they would report such a folder as lacking an mds checkpoint's `latest`."""
    if (path / CONFIG).is_file() or not path.is_dir():
        return None
    weights = [
        name for name in (SAFETENSORS, SAFETENSORS_INDEX, TORCH_BIN) if (path / name).is_file()
    ]
    if weights:
        return (
            f"{path}: a Hugging Face folder needs {CONFIG} beside {weights[0]}; copy the model's "
            f"{CONFIG} there (save_pretrained writes both)"
        )
    names = dict.fromkeys(name for names in TOKENIZER_FILES.values() for name in names)
    tokenizer = [name for name in names if (path / name).is_file()]
    if not tokenizer:
        return None
    return (
        f"{path}: tokenizer files ({', '.join(tokenizer)}) but no model; a Hugging Face folder "
        f"holds {CONFIG} and {SAFETENSORS} (or {TORCH_BIN}) beside them; give the model's folder"
    )


def read_hf_config(path: Path) -> dict[str, Any]:
    """The folder's `config.json`, checked to describe a family mds reads (`hf_families`)."""
    file = path / CONFIG
    if not file.is_file():
        raise ValueError(
            missing_config(path)
            or f"{file}: missing; a Hugging Face model folder holds its config there"
        )
    try:
        hf = json.loads(file.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{file}:{error.lineno}: not valid JSON ({error.msg})") from None
    try:
        hf_adapter_of_folder(hf)
    except ValueError as error:
        raise ValueError(f"{file}: {error}") from None
    return hf


def stored_dtype(hf: dict[str, Any]) -> str | None:
    """The dtype name the config says its weights were saved in, when it says one we know."""
    dtype = hf.get("torch_dtype") or hf.get("dtype")
    return dtype if dtype in _DTYPES else None


def gpt_config_from_hf(hf: dict[str, Any], **overrides: Any) -> GPTConfig:
    """The GPTConfig of a family's `config.json` (its adapter's `config_fields`); a ValueError
    (without the file's name) for what mds GPTs do not implement or a missing key."""
    seq = overrides.pop("seq_length", None)
    fields = hf_adapter_of_folder(hf).config_fields(hf, seq_length=seq)
    return GPTConfig(
        **fields,
        params_dtype=stored_dtype(hf) or "float32",
        **overrides,
    )


def _hf_name(name: str, model_type: str) -> str | None:
    """The name a stored tensor is read under (the adapter's); None for those not read."""
    if model_type == GPT2_HF:
        if name == "lm_head.weight" or name.endswith((".attn.bias", ".attn.masked_bias")):
            return None  # tied to wte / causal-mask buffers of older transformers versions
        return name if name.startswith("transformer.") else f"transformer.{name}"
    if model_type == BLOOM_HF and not name.startswith(("transformer.", "lm_head.")):
        return f"transformer.{name}"
    return name


class HFWeights(Mapping[str, torch.Tensor]):
    """A Hugging Face folder's weights under the names its family's adapter reads (model_type:
    config.json's; GPT-2's by default), read one tensor per lookup (safetensors:
    `safetensors_file`, into memory of its own), so a converter going part by part holds one
    part; `pytorch_model.bin` is memory-mapped by torch.load."""

    def __init__(self, path: Path, model_type: str = GPT2_HF) -> None:
        self.path = path
        self.model_type = model_type
        self._sources: dict[str, tuple[Any, Any]] = {}  # name -> (file or state dict, its key)
        try:
            if (path / SAFETENSORS).is_file():
                self._add_safetensors([path / SAFETENSORS])
            elif (path / SAFETENSORS_INDEX).is_file():
                index = json.loads((path / SAFETENSORS_INDEX).read_text())
                shards = sorted(set(index["weight_map"].values()))
                self._add_safetensors([path / shard for shard in shards])
            elif (path / TORCH_BIN).is_file():
                bin_file = path / TORCH_BIN
                state = torch.load(
                    bin_file,
                    map_location="cpu",
                    weights_only=True,
                    mmap=zipfile.is_zipfile(bin_file),  # legacy (pre-1.6) files cannot be mapped
                )
                for stored in state:
                    if (name := _hf_name(stored, model_type)) is not None:
                        self._sources[name] = (state, stored)
            else:
                raise ValueError(
                    f"{path}: a Hugging Face folder ({CONFIG}) without weights: no {SAFETENSORS}, "
                    f"{SAFETENSORS_INDEX} or {TORCH_BIN}"
                )
        except (OSError, KeyError, json.JSONDecodeError, RuntimeError) as error:
            raise ValueError(f"{path}: not readable Hugging Face weights ({error})") from None

    def _add_safetensors(self, files: list[Path]) -> None:
        for file in files:
            for stored, tensor in safetensors_file.read_header(file).items():
                if (name := _hf_name(stored, self.model_type)) is not None:
                    self._sources[name] = (file, tensor)

    def __getitem__(self, name: str) -> torch.Tensor:
        source, key = self._sources[name]
        if isinstance(source, dict):
            return source[key]
        return as_tensor(safetensors_file.read_tensor(source, key))

    def __contains__(self, name: object) -> bool:
        return name in self._sources  # Mapping's own would read the tensor to find out

    def __iter__(self) -> Iterator[str]:
        return iter(self._sources)

    def __len__(self) -> int:
        return len(self._sources)


# A tokenizer in a Hugging Face folder: the names the folder gives the files a tokenizer record
# names (FILE_KEYS order); tokenizer.json, the whole description of any tokenizer, comes first.
TOKENIZER_FILES = {
    PRETRAINED_FROM_HF: ("tokenizer.json",),
    GPT2_BPE: ("vocab.json", "merges.txt"),
    # upstream's --tokenizer-model kinds: exported under the names Llama folders use
    GPT_SENTENCEPIECE: ("tokenizer.model",),
    SENTENCEPIECE: ("tokenizer.model",),
    HF_TOKENIZER: ("tokenizer.json",),
}
# What a folder's own files are read as (a tokenizer.model alone says not which of upstream's
# two SentencePiece types, nor Hugging Face's BOS handling, made the ids).
FOLDER_KINDS = (PRETRAINED_FROM_HF, GPT2_BPE)


def hf_folder_tokenizer(path: Path) -> TokenizerRecord | None:
    """The tokenizer the folder holds (tokenizer.json, else vocab.json + merges.txt): its type,
    the files' absolute paths and SHA-256; None when it holds none."""
    for kind in FOLDER_KINDS:
        files = [path / name for name in TOKENIZER_FILES[kind]]
        if all(file.is_file() for file in files):
            return TokenizerRecord.of_files(kind, files)
    return None
