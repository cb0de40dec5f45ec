"""Hugging Face GPT-2 folders (`config.json` + `model.safetensors`) to and from checkpoints.

export-hf: the checkpoint consolidated to TP=1, converted by `mds_model.to_hf_gpt2_state_dict`
(padding rows dropped, Conv1D weights transposed, QKV rows regrouped) and written with
`safetensors` (no `lm_head.weight`: it is tied, as `save_pretrained` writes it), so
`GPT2LMHeadModel.from_pretrained` loads it with no missing or unexpected keys. Rotary, ALiBi and
the embedding LayerNorm have no GPT-2 equivalent and are refused. import-hf: the reverse, then
written as an mds-train checkpoint at any TP/PP (iteration 0, no optimizer state).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from mds_common.files import atomic_directory
from mds_model import GPTConfig, from_hf_gpt2_state_dict, hf_gpt2_config, to_hf_gpt2_state_dict

from .config import ExportConfig, ImportConfig
from .consolidate import consolidate
from .names import FINAL_NORM, LAYER_NAMES, embedding_names, layer_name
from .output import LATEST, check_save_folder, output_meta, target_config, write_meta
from .source import open_source
from .writer import CheckpointWriter, tag_for

CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"
_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


@dataclass(frozen=True)
class ExportResult:
    folder: Path
    num_tensors: int
    logit_difference: float | None


def _refuse_non_gpt2(config: GPTConfig, where: Path) -> None:
    if config.position_embedding_type != "learned":
        raise ValueError(
            f"{where}: position_embedding_type {config.position_embedding_type!r} has no "
            "GPT2LMHeadModel equivalent (GPT-2 has learned positions); not exported"
        )
    if config.embed_layernorm:
        raise ValueError(
            f"{where}: the embedding LayerNorm (--embed-layernorm, BLOOM) has no GPT2LMHeadModel "
            "equivalent; not exported"
        )


def export_hf(config: ExportConfig) -> ExportResult:
    from safetensors.torch import save_file

    source = open_source(config.load, iteration=config.iteration)
    _refuse_non_gpt2(source.config, source.folder)
    model = consolidate(source)
    eos = config.eos_token_id
    if eos is None:
        eos = (model.meta.get("tokenizer") or {}).get("eod_id")
    hf_config = hf_gpt2_config(model.config, eos_token_id=eos)
    hf_config["torch_dtype"] = _DTYPES[model.config.torch_dtype]
    state = to_hf_gpt2_state_dict(model.state_dict, model.config)
    _check_hf_folder(config.save)
    difference = None
    with atomic_directory(config.save) as staging:
        (staging / CONFIG_FILE).write_text(json.dumps(hf_config, indent=2) + "\n")
        save_file(state, str(staging / WEIGHTS_FILE), metadata={"format": "pt"})
        if config.verify:
            from .verify import check_logits

            difference = check_logits(model, _consolidated_from_hf(staging))
    return ExportResult(config.save, len(state), difference)


def _check_hf_folder(save: Path) -> None:
    """An existing folder is replaced only when it holds nothing but an earlier export."""
    if save.is_dir() and {p.name for p in save.iterdir()} - {CONFIG_FILE, WEIGHTS_FILE}:
        raise ValueError(f"--save {save}: folder exists with other files; choose a new folder")
    if save.exists() and not save.is_dir():
        raise ValueError(f"--save {save}: exists and is not a folder")


def _read_hf(folder: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    config_path, weights_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    for path in (config_path, weights_path):
        if not path.is_file():
            raise ValueError(f"{path}: missing; import-hf reads a Hugging Face GPT-2 folder")
    try:
        hf_config = json.loads(config_path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{config_path}:{error.lineno}: not valid JSON ({error.msg})") from None
    if hf_config.get("model_type") != "gpt2":
        raise ValueError(
            f"{config_path}: model_type {hf_config.get('model_type')!r}; only GPT-2 is imported"
        )
    try:
        weights = load_file(str(weights_path))
    except (SafetensorError, OSError) as error:
        raise ValueError(f"{weights_path}: not a readable safetensors file ({error})") from None
    # Hugging Face's own checkpoints prefix nothing (GPT2Model) or 'transformer.' (LMHead).
    weights = {
        (k if k.startswith(("transformer.", "lm_head.")) else "transformer." + k): v
        for k, v in weights.items()
    }
    return hf_config, weights


def gpt_config_from_hf(hf: dict[str, Any], *, tp: int = 1, **overrides: Any) -> GPTConfig:
    activation = hf.get("activation_function", "gelu_new")
    if activation not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ValueError(f"activation_function {activation!r}: ours is GPT-2's tanh GeLU")
    if hf.get("scale_attn_by_inverse_layer_idx") or hf.get("reorder_and_upcast_attn"):
        raise ValueError("scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn are not ours")
    dtype = hf.get("torch_dtype") or hf.get("dtype") or "float32"
    seq = overrides.pop("seq_length", None) or hf["n_positions"]
    return GPTConfig(
        num_layers=hf["n_layer"],
        hidden_size=hf["n_embd"],
        num_attention_heads=hf["n_head"],
        vocab_size=hf["vocab_size"],
        seq_length=seq,
        ffn_hidden_size=hf.get("n_inner") or None,
        max_position_embeddings=hf["n_positions"],
        layernorm_epsilon=hf.get("layer_norm_epsilon", 1e-5),
        hidden_dropout=hf.get("resid_pdrop", 0.1),
        attention_dropout=hf.get("attn_pdrop", 0.1),
        init_method_std=hf.get("initializer_range", 0.02),
        params_dtype=dtype if dtype in ("float32", "bfloat16", "float16") else "float32",
        tensor_model_parallel_size=tp,
        **overrides,
    )


def _consolidated_from_hf(folder: Path):
    from .consolidate import ConsolidatedModel

    hf_config, weights = _read_hf(folder)
    config = gpt_config_from_hf(hf_config)
    return ConsolidatedModel(config, {}, from_hf_gpt2_state_dict(weights, config))


def import_hf(config: ImportConfig) -> Path:
    hf_config, weights = _read_hf(config.load)
    try:
        model = gpt_config_from_hf(
            hf_config,
            make_vocab_size_divisible_by=config.make_vocab_size_divisible_by,
            seq_length=config.seq_length,
        )
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{config.load / CONFIG_FILE}: {error}") from None
    target = target_config(
        model, tensor_parallel=config.tensor_parallel, pipeline_parallel=config.pipeline_parallel
    )
    state = from_hf_gpt2_state_dict(weights, model)
    del weights
    check_save_folder(config.save)
    tag = tag_for(0)
    with atomic_directory(config.save) as staging:
        folder = staging / tag
        writer = CheckpointWriter(folder, config=target, pipeline_parallel=config.pipeline_parallel)
        parts = [embedding_names(learned_positions=True, embed_layernorm=False)]
        parts += [[layer_name(i, n) for n in LAYER_NAMES] for i in range(model.num_layers)]
        parts.append(FINAL_NORM)
        for names in parts:
            writer.write_part({name: state.pop(name) for name in names})
        writer.finish({})
        eos = hf_config.get("eos_token_id")
        base = {"tokenizer": {"vocab_size": model.vocab_size, "eod_id": eos}}
        provenance = {"from": str(config.load.resolve()), "layout": "huggingface-gpt2"}
        write_meta(
            folder,
            output_meta(
                base,
                target,
                pipeline_parallel=config.pipeline_parallel,
                tag=tag,
                reshaped={**provenance, "rng_states": False},
                optimizer=None,
            ),
        )
        (staging / LATEST).write_text(tag)
    return config.save / tag
