"""The model a checkpoint holds, as a `GPTConfig`: from mds-train's `meta.json`, or else from the
Megatron `args` namespace that Megatron and Megatron-DeepSpeed pickle into their files.

Megatron-DeepSpeed (BS) pickles `position_embedding_type` as its own enum (rotary 1, absolute 2,
alibi 3); Megatron-LM (MS) as a string (`learned_absolute`, `rope`). The tokenizer's vocabulary
size comes from `original_vocab_size` in `checkpoint_info` (BS) or `universal_checkpoint_info`
(deepspeedai; `source.vocabulary_info` picks) when present; without either the padded size stands
for it, which keeps every row. The fields under upstream's names are mds_model.arguments' rows,
and the MLP's activation its rule of upstream's ParallelMLP (`activation_from_args`): deepspeedai's
`--swiglu` (each TP rank's dense_h_to_4h rows [gate_r; up_r]) or bigscience's `--glu-activation
swiglu` (megatron/model/glu_activations.py `x1 * silu(x2)`: [up_r; gate_r], `up_first_of_args`).
deepspeedai marks rotary positions by `use_rotary_position_embeddings` (no position type).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mds_model import GPTConfig, for_tensor_parallel, padded_vocab_size
from mds_model.arguments import (
    POSITION_OF_BIGSCIENCE,
    POSITION_OF_MEGATRON,
    activation_of,
    fields_from_args,
)

from .ptfile import Missing

CONFIG_FIELDS = tuple(field.name for field in dataclasses.fields(GPTConfig))


def config_from_meta(model: dict[str, Any], *, where: str) -> GPTConfig:
    """meta.json's `model` (every GPTConfig field, plus derived ones): the vocabulary rows are
    its `padded_vocab_size`; files written before GPTConfig held no parallel size say the
    tensor-parallel size they were padded for instead."""
    try:
        config = GPTConfig(**{name: model[name] for name in CONFIG_FIELDS if name in model})
        rows = model.get("padded_vocab_size")
        if rows is None:
            rows = padded_vocab_size(
                config.vocab_size,
                make_vocab_size_divisible_by=config.make_vocab_size_divisible_by,
                tensor_model_parallel_size=int(model.get("tensor_model_parallel_size", 1)),
            )
        if config.pad_vocab_size_to is None and rows != config.padded_vocab_size:
            config = dataclasses.replace(config, pad_vocab_size_to=int(rows))
        return config
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: meta.json's model does not describe a GPT ({error})") from None


def check_model_flags(config: GPTConfig, given: tuple[tuple[str, int], ...]) -> None:
    """Megatron model flags of a command line, (GPTConfig field, value), must describe the
    checkpoint's model: the checkpoint says its own shape, a flag may only repeat it."""
    for name, value in given:
        actual = {
            "max_position_embeddings": config.max_positions,
            "ffn_hidden_size": config.ffn_size,
        }.get(name)
        if actual is None:
            actual = getattr(config, name)
        if value != actual:
            flag = "--" + name.replace("_", "-")
            raise ValueError(
                f"{flag} {value}, but the checkpoint's model has {actual}; drop the flag (the "
                "checkpoint says its shape)"
            )


def _position_type(value: Any) -> str:
    if value is None:
        return "learned"
    if isinstance(value, Missing):
        number = value.args[0] if value.args else None
        if number in POSITION_OF_BIGSCIENCE:
            return POSITION_OF_BIGSCIENCE[number]
    name = getattr(value, "name", value)
    if isinstance(name, str):
        name = name.split(".")[-1]
        return POSITION_OF_MEGATRON.get(name, name)
    raise ValueError(f"unknown position_embedding_type {value!r}")


_BIGSCIENCE_SWIGLU = "swiglu"  # bigscience's --glu-activation choice mds computes


def up_first_of_args(args: Any) -> bool:
    """Whether each TP rank's gated dense_h_to_4h rows are [up_r; gate_r]: bigscience's
    --glu-activation swiglu (its GLU takes `x1 * silu(x2)` of the rank's output halves)."""
    return getattr(args, "glu_activation", None) == _BIGSCIENCE_SWIGLU


def activation_from_args(args: Any, *, where: str) -> str:
    """GPTConfig.activation as upstream's ParallelMLP picks it from these args
    (mds_model.arguments.activation_of): deepspeedai's `swiglu` or bigscience's
    `glu_activation` swiglu first, else its GeLU rule. Absent fields take arguments.py's
    defaults (openai_gelu False, onnx_safe None, bias_gelu_fusion True). Squared ReLU and
    bigscience's other GLUs are MLPs mds does not compute."""
    glu = getattr(args, "glu_activation", None)
    swiglu = bool(getattr(args, "swiglu", False))
    if getattr(args, "squared_relu", None):
        raise ValueError(
            f"{where}: Megatron's args set squared_relu=True, an MLP mds GPTs do not compute"
        )
    if glu and glu != _BIGSCIENCE_SWIGLU:
        raise ValueError(
            f"{where}: Megatron's args set glu_activation={glu!r}, an MLP mds GPTs do not compute "
            f"(they compute a GeLU or SwiGLU)"
        )
    if glu and swiglu:
        raise ValueError(
            f"{where}: Megatron's args set both swiglu (deepspeedai: [gate; up] per rank) and "
            "glu_activation (bigscience: [up; gate]); the MLP's layout cannot be told"
        )
    return activation_of(
        openai_gelu=getattr(args, "openai_gelu", False),
        onnx_safe=getattr(args, "onnx_safe", None),
        bias_gelu_fusion=getattr(args, "bias_gelu_fusion", None),
        swiglu=swiglu or bool(glu),
    )


def _dtype_name(args: Any) -> str:
    if getattr(args, "bf16", False):
        return "bfloat16"
    if getattr(args, "fp16", False):
        return "float16"
    return "float32"


def _position_from_args(args: Any, where: str) -> str:
    """The position type: Megatron-LM's and bigscience's `position_embedding_type`, else
    deepspeedai's `use_rotary_position_embeddings` (which turns its learned table off)."""
    named = getattr(args, "position_embedding_type", None)
    if not getattr(args, "use_rotary_position_embeddings", False):
        return _position_type(named)
    if named is not None and _position_type(named) != "rotary":
        raise ValueError(
            f"{where}: Megatron's args say use_rotary_position_embeddings=True and "
            f"position_embedding_type={getattr(named, 'name', named)!r}; the positions cannot "
            "be told"
        )
    return "rotary"


def _refuse_unread_features(args: Any, where: str) -> None:
    experts = getattr(args, "num_experts", None)
    if (
        isinstance(experts, list | tuple)
        and any(int(e) > 1 for e in experts)
        or (isinstance(experts, int) and experts > 1)
    ):
        raise ValueError(
            f"{where}: Megatron's args say num_experts={experts} (mixture of experts), which mds "
            "does not read; this checkpoint cannot be converted"
        )


def config_from_megatron_args(
    args: Any, *, checkpoint_info: dict | None, tensor_model_parallel_size: int, where: str
) -> GPTConfig:
    """GPTConfig from Megatron's pickled argparse namespace: its rows are the args'
    `padded_vocab_size`, else Megatron's padding at the files' TP size."""

    def arg(name: str, default: Any = None) -> Any:
        value = getattr(args, name, default)
        return default if value is None else value

    missing = [n for n in ("num_layers", "hidden_size", "num_attention_heads") if arg(n) is None]
    if missing:
        raise ValueError(
            f"{where}: Megatron's args lack {', '.join(missing)}; not a GPT checkpoint"
        )
    _refuse_unread_features(args, where)
    padded = arg("padded_vocab_size")
    info = checkpoint_info or {}
    vocab = info.get("original_vocab_size") or padded
    if vocab is None:
        raise ValueError(
            f"{where}: neither padded_vocab_size nor checkpoint_info in Megatron's args"
        )
    fields = fields_from_args(args)
    fields.setdefault("seq_length", int(arg("max_position_embeddings", 1024)))
    fields.update(
        vocab_size=int(vocab),
        position_embedding_type=_position_from_args(args, where),
        activation=activation_from_args(args, where=where),
        params_dtype=_dtype_name(args),
    )
    try:
        config = GPTConfig(**fields)
        if padded is None:
            config = for_tensor_parallel(config, tensor_model_parallel_size)
        elif config.padded_vocab_size != padded:
            config = dataclasses.replace(config, pad_vocab_size_to=int(padded))
    except ValueError as error:
        raise ValueError(f"{where}: Megatron's args describe no valid GPT ({error})") from None
    return config
