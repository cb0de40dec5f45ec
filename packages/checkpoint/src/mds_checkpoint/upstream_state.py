"""The keys Megatron(-DeepSpeed) itself reads from a checkpoint's rank files, for what mds writes.

Upstream's `save_checkpoint` (megatron/checkpointing.py, both forks) puts `args` (its argparse
namespace), `checkpoint_version` 3.0, `iteration` and `tokens` beside the model; bigscience adds
`checkpoint_info` (`_checkpoint_info`), deepspeedai `universal_checkpoint_info`
(`_universal_checkpoint_info` and megatron/model/gpt_model.py `UniversalCheckpointInfo`). Readers
take a missing `checkpoint_version` for 0 and reorder query/key/value rows that mds already holds
per head (`[np, 3, hn]`, version >= 2), so it is always written. `args` carries upstream's names
for the model (mds_model.arguments' rows and MLP rule: the Llama family's normalization,
num_key_value_heads, add_bias_linear, untie_embeddings_and_output_weights, rope_theta,
rotary_percent, swiglu), topology, tokenizer and progress.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from mds_common.tokenizer_record import (
    GPT2_BPE,
    GPT_SENTENCEPIECE,
    HF_TOKENIZER,
    SENTENCEPIECE,
    TokenizerRecord,
)
from mds_model import GPTConfig
from mds_model.arguments import BIGSCIENCE_POSITIONS, MEGATRON_POSITIONS, written_args

from .ptfile import GlobalName

CHECKPOINT_VERSION = 3.0
UNIVERSAL_CHECKPOINT_VERSION = 0.4  # deepspeed/checkpoint/constants.py (DeepSpeed 0.19)
GPT2_EOD_TOKEN = "<|endoftext|>"
GPT2_EOD_ID = 50256  # in GPT-2's vocab.json, the file GPT2BPETokenizer reads


class _BigscienceEnum:
    """bigscience's `megatron.enums.PositionEmbeddingType(value)`, pickled by name as Python
    pickles an Enum member (the class, called with its value), without the module here."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __reduce__(self):
        return GlobalName("megatron.enums", "PositionEmbeddingType"), (self.value,)


# upstream reads these from `--tokenizer-model`
MODEL_KINDS = (SENTENCEPIECE, GPT_SENTENCEPIECE, HF_TOKENIZER)


def tokenizer_eod_id(tokenizer: TokenizerRecord) -> int | None:
    """The end-of-document id of a recorded tokenizer: its `eod_id`, else for GPT-2 BPE the id of
    <|endoftext|> in its vocab.json (GPT-2's own 50256 when the file is not at hand)."""
    if tokenizer.eod_id is not None:
        return int(tokenizer.eod_id)
    if tokenizer.type != GPT2_BPE:
        return None
    vocab = tokenizer.vocab_file
    if vocab and Path(vocab).is_file():
        try:
            return int(json.loads(Path(vocab).read_text())[GPT2_EOD_TOKEN])
        except (ValueError, KeyError, TypeError):
            return None
    return GPT2_EOD_ID


def megatron_args(
    config: GPTConfig,
    *,
    tensor_model_parallel_size: int,
    pipeline_model_parallel_size: int,
    progress: dict[str, int],
    tokenizer: TokenizerRecord,
    layout: str,
) -> argparse.Namespace:
    """Upstream's `args` for this model at the target topology (the fields its loaders read:
    `check_checkpoint_args`, `load_args_from_checkpoint`, Hugging Face's converter)."""
    position = config.position_embedding_type
    deepspeed = layout != "megatron"
    # Upstream's load_args_from_checkpoint does not read the GeLU flags: a run continuing these
    # files passes them (--no-bias-gelu-fusion for the exact GeLU).
    args = dict(
        **written_args(config),
        encoder_num_layers=config.num_layers,
        kv_channels=config.head_dim,
        encoder_seq_length=config.seq_length,
        padded_vocab_size=config.padded_vocab_size,
        tensor_model_parallel_size=tensor_model_parallel_size,
        pipeline_model_parallel_size=pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=None,
        num_layers_per_virtual_pipeline_stage=None,
        tokenizer_type=tokenizer.type,
        vocab_file=tokenizer.vocab_file,
        merge_file=tokenizer.merge_file,
        tokenizer_name_or_path=tokenizer.name_or_path,
        tokenizer_model=tokenizer.tokenizer_file if tokenizer.kind in MODEL_KINDS else None,
        iteration=int(progress.get("iteration", 0)),
        consumed_train_samples=int(progress.get("consumed_train_samples", 0)),
        consumed_valid_samples=int(progress.get("consumed_valid_samples", 0)),
        consumed_train_tokens=int(progress.get("consumed_train_tokens", 0)),
        fp16=config.params_dtype == "float16",
        bf16=config.params_dtype == "bfloat16",
        # deepspeedai's switches; Megatron-LM's (and bigscience's) position_embedding_type
        add_position_embedding=position == "learned",
        use_rotary_position_embeddings=position == "rotary",
        position_embedding_type=(
            _BigscienceEnum(BIGSCIENCE_POSITIONS[position])
            if layout == "bigscience"
            else MEGATRON_POSITIONS[position]
        ),
        squared_relu=False,
        apply_layernorm_1p=False,
        apply_residual_connection_post_layernorm=False,
        data_parallel_random_init=False,
        universal_checkpoint=False,
        deepspeed=deepspeed,
        no_pipeline_parallel=deepspeed
        and pipeline_model_parallel_size == 1
        and layout != "bigscience",
        mos=False,
        kd=False,
    )
    return argparse.Namespace(**args)


# The names of the parameters a universal_checkpoint_info's patterns match, per engine module:
# DeepSpeed's `ds_to_universal` matches them against the names in the ZeRO partitions, so a
# pattern of another naming would silently treat a replicated parameter as split.
_PATTERN_NAMES = {
    # (word embeddings, position embeddings, layer prefix, final norm prefix, untied head);
    # the pipeline's untied embedding and head are plain LayerSpecs, `{spec}.X`
    "megatron": (
        "language_model.embedding.word_embeddings.weight",
        "language_model.embedding.position_embeddings.weight",
        "language_model.encoder.layers.",
        "language_model.encoder.final_layernorm.",
        "language_model.output_layer.weight",
    ),
    "pipe": (
        "tied_modules.embed.word_embeddings.weight",
        "tied_modules.embed.position_embeddings.weight",
        "",
        r"\d+.",
        r"\d+.lm_head.weight",
    ),
}
_PIPE_UNTIED_WORDS = r"\d+.word_embeddings.weight"


def universal_checkpoint_info(
    config: GPTConfig, *, tensor_model_parallel_size: int, original_vocab_size: int, names: str
) -> dict[str, Any]:
    """deepspeedai's `_universal_checkpoint_info`: the vocabulary sizes and its parameter-pattern
    lists, as `UniversalCheckpointInfo` (megatron/model/gpt_model.py at 6acc370a) builds them
    from the args (normalization, add_bias_linear, untied head, swiglu), over the parameter
    names of `names` (a key of _PATTERN_NAMES)."""
    learned = config.learned_positions
    layernorm = config.normalization == "layernorm"
    untied = config.untie_embeddings_and_output_weights
    words, positions, layers, final, head = _PATTERN_NAMES[names]
    if names == "pipe" and untied:
        words = _PIPE_UNTIED_WORDS
    info: dict[str, Any] = {
        "universal_checkpoint_version": UNIVERSAL_CHECKPOINT_VERSION,
        "original_vocab_size": original_vocab_size,
        "padded_vocab_size": config.padded_vocab_size,
        "vocabulary_parameter_patterns": [words, *([head] if untied else [])],
    }
    if names == "pipe":
        info["pipeline_replicated_parameter_patterns"] = (
            [] if untied else [words] + ([positions] if learned else [])
        )
    if tensor_model_parallel_size > 1:
        replicated = [
            layers + r"\d+.input_layernorm.weight",
            layers + r"\d+.post_attention_layernorm.weight",
            final + "weight",
        ]
        if layernorm:
            replicated.append(final + "bias")
        if learned:
            replicated.append(positions)
        if config.add_bias_linear:
            replicated += [
                layers + r"\d+.self_attention.dense.bias",
                layers + r"\d+.mlp.dense_4h_to_h.bias",
            ]
        if layernorm:
            replicated += [
                layers + r"\d+.input_layernorm.bias",
                layers + r"\d+.post_attention_layernorm.bias",
            ]
        info["tp_replicated_parameter_patterns"] = replicated
        info["parameter_with_row_parallelism_patterns"] = [
            layers + r"\d+.mlp.dense_4h_to_h.weight",
            layers + r"\d+.self_attention.dense.weight",
        ]
    # SwiGLU's dense_h_to_4h: each TP slice is [gate_r; up_r]
    gated = []
    if config.gated:
        gated.append(layers + r"\d+.mlp.dense_h_to_4h.weight")
        if config.add_bias_linear:
            gated.append(layers + r"\d+.mlp.dense_h_to_4h.bias")
    info["parameter_with_2_sub_params_cat_dim_0"] = gated
    return info


def scheduler_state(record: dict[str, Any], progress: dict[str, Any]) -> dict[str, Any]:
    """Upstream's `OptimizerParamScheduler.state_dict()`, in its order, for the schedule `record`
    (meta.json's `lr_schedule`, in upstream's names) at `progress` (meta.json's: `lr_samples` the
    samples of applied steps, `lr_tokens` the tokens its last step read, `lr_warmup_end_tokens`):
    what its DeepSpeed engine saves as `lr_scheduler` and loads into its scheduler on resume."""
    warmup_tokens = record["lr_warmup_tokens"]
    ended = progress.get("lr_warmup_end_tokens")
    if ended is not None and record["lr_decay_tokens"] is not None:
        # Upstream's get_lr records the tokens where a warmup in samples ended, only for a
        # decay in tokens; its load would otherwise find a warmup the flags did not give.
        warmup_tokens = ended
    return {
        "max_lr": record["max_lr"],
        "lr_warmup_steps": record["lr_warmup_steps"],
        "lr_warmup_tokens": warmup_tokens,
        "num_steps": int(progress.get("lr_samples") or 0),
        "num_tokens": int(progress.get("lr_tokens") or 0),
        "lr_decay_style": record["lr_decay_style"],
        "lr_decay_steps": record["lr_decay_steps"],
        "lr_decay_tokens": record["lr_decay_tokens"],
        "min_lr": record["min_lr"],
        "start_wd": record["start_wd"],
        "end_wd": record["end_wd"],
        "wd_incr_style": record["wd_incr_style"],
        "wd_incr_steps": record["wd_incr_steps"],
    }


def scheduler_progress(record: dict[str, Any] | None) -> dict[str, int | None]:
    """`scheduler_state`'s inverse for the progress: meta.json's `lr_samples` (num_steps: samples
    of applied steps; consumed samples count skipped ones too), `lr_tokens` (num_tokens) and
    `lr_warmup_end_tokens` (a warmup length in tokens that a token decay recorded), from a
    scheduler state_dict in upstream's current or older key names; {} when it holds none."""
    if not record or "num_steps" not in record and "num_iters" not in record:
        return {}
    warmup = record.get("lr_warmup_tokens", record.get("warmup_tokens"))
    return {
        "lr_samples": int(record.get("num_steps", record.get("num_iters"))),
        "lr_tokens": int(record.get("num_tokens") or 0),
        "lr_warmup_end_tokens": None if warmup is None else int(warmup),
    }


def upstream_keys(
    config: GPTConfig,
    *,
    tensor_model_parallel_size: int,
    pipeline_model_parallel_size: int,
    progress: dict[str, Any],
    tokenizer: TokenizerRecord,
    layout: str,
    lr_schedule: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The client state upstream's save_checkpoint writes (less `rng_state`: per-rank RNG states
    do not carry over to another topology), in its order; with the schedule's record, the
    scheduler's state (DeepSpeed's `lr_scheduler`, plain Megatron's `opt_param_scheduler`), which
    upstream's resume loads (a `None` there stops it)."""
    original = config.vocab_size  # the tokenizer's (mds pads only the embedding's rows)
    pipe = layout == "bigscience" or (layout != "megatron" and pipeline_model_parallel_size > 1)
    scheduler = {}
    if lr_schedule is not None:
        key = "opt_param_scheduler" if layout == "megatron" else "lr_scheduler"
        scheduler[key] = scheduler_state(lr_schedule, progress)
    return {
        "args": megatron_args(
            config,
            tensor_model_parallel_size=tensor_model_parallel_size,
            pipeline_model_parallel_size=pipeline_model_parallel_size,
            progress=progress,
            tokenizer=tokenizer,
            layout=layout,
        ),
        "checkpoint_version": CHECKPOINT_VERSION,
        "iteration": int(progress.get("iteration", 0)),
        "tokens": int(progress.get("consumed_train_tokens", 0)),
        "checkpoint_info": {
            "padded_vocab_size": config.padded_vocab_size,
            "original_vocab_size": original,
        },
        "universal_checkpoint_info": universal_checkpoint_info(
            config,
            tensor_model_parallel_size=tensor_model_parallel_size,
            original_vocab_size=original,
            names="pipe" if pipe else "megatron",
        ),
        **scheduler,
    }
