"""Parameter names as DeepSpeed's engines know them, and the order their optimizers hold them.

The plain engine names parameters as the module it wraps does: Megatron-DeepSpeed's `GPTModel`
and mds-train's (`mds_train.model_setup.TrainingGPT`) by Megatron's nested names
(`language_model.encoder.layers.I.X`); mds-train before it by the plain GPT's own (`layers.I.X`).
The pipeline engine's `PipelineModule` names a stage's tied embedding `tied_modules.embed.X` and
every other layer `{spec index}.X`, numbered as each fork's `GPTModelPipe` lists its specs
(`mds_model.naming`; mds-train's is deepspeedai's); untied (upstream's
--untie-embeddings-and-output-weights) the embedding is `1.word_embeddings.weight` and the head
upstream's LMHeadPipe, `{N+3}.lm_head.weight`, Megatron's `language_model.output_layer.weight`.
Its stages are cut with DeepSpeed's `partition_balanced` over the transformer layers
("type:transformer").
mds-train's optimizers take Megatron's two parameter groups: the 2-D weights (decayed), then the
1-D biases and norms, each in module order.
"""

from __future__ import annotations

from typing import Any

from mds_model import GPTConfig
from mds_model.naming import (
    EMBEDDING_INDEX,
    LM_HEAD,
    MEGATRON_PREFIXES,
    OUTPUT_LAYER,
    OWN_NUMBERING,
    TIED_PREFIX,
    canonical_layer_key,
    layer_name,
    layer_of,
    pipe_layer_indices,
)
from mds_model.parameters import (
    Param,
    embedding_parameters,
    final_parameters,
    head_parameters,
    layer_parameters,
)

_OUTPUT_PREFIX = OUTPUT_LAYER.split(".")[0] + "."  # "output_layer."


def pipeline_file_key(name: str, num_layers: int, numbering: str) -> tuple[int, str]:
    """(GPTModelPipe spec index, key inside its layer file) of a plain-GPT parameter name in a
    fork's numbering: the inverse of `pipeline_to_plain`."""
    first, final = pipe_layer_indices(num_layers, numbering)
    layer = layer_of(name)
    if layer is not None:
        return first + layer[0], layer[1]
    if name.startswith("embedding."):
        return EMBEDDING_INDEX, name[len("embedding.") :]
    if name.startswith("final_layernorm."):
        return final, name[len("final_layernorm.") :]
    if name.startswith(_OUTPUT_PREFIX):  # LMHeadPipe, the spec after the final norm
        return final + 1, LM_HEAD + name[len(_OUTPUT_PREFIX) :]
    raise ValueError(f"no pipeline layer holds {name}")


def megatron_nested(flat: dict[str, Any], *, layer_offset: int = 0) -> dict[str, Any]:
    """Plain GPT names -> the nested dict Megatron's `GPTModel.state_dict_for_save_checkpoint`
    writes: `language_model` -> `embedding` -> `word_embeddings` -> `weight` (and BLOOM's
    `norm.*`), `position_embeddings` -> `weight`; `encoder` -> `layers.I.X` (I counted from
    `layer_offset`, a pipeline stage's first layer) and `final_layernorm.X`; the untied head's
    `output_layer` -> `weight`. Only the parts present are nested (a pipeline stage holds
    some)."""
    embedding: dict[str, dict[str, Any]] = {}
    encoder: dict[str, Any] = {}
    output: dict[str, Any] = {}
    for name, value in flat.items():
        layer = layer_of(name)
        if layer is not None:
            encoder[layer_name(layer[0] - layer_offset, layer[1])] = value
        elif name.startswith(_OUTPUT_PREFIX):
            output[name[len(_OUTPUT_PREFIX) :]] = value
        elif name.startswith("embedding."):
            sub, key = name[len("embedding.") :].split(".", 1)
            embedding.setdefault(sub, {})[key] = value
        else:
            encoder[name] = value
    language: dict[str, Any] = {}
    if embedding:
        language["embedding"] = embedding
    if encoder:
        language["encoder"] = encoder
    if output:
        language["output_layer"] = output
    return {"language_model": language}


def megatron_flat(nested: dict[str, Any]) -> dict[str, Any]:
    """`megatron_nested`'s inverse for a whole model written at version 3.0 (rows per head, as
    mds-train's own files): the plain GPT's state dict."""
    language = nested["language_model"]
    flat = {}
    for sub, values in language.get("embedding", {}).items():
        for key, value in values.items():
            flat[f"embedding.{sub}.{key}"] = value
    flat.update(language.get("encoder", {}))
    for key, value in language.get("output_layer", {}).items():
        flat[_OUTPUT_PREFIX + key] = value
    return flat


def plain_to_megatron(name: str) -> str:
    """A plain GPT name -> Megatron's nested parameter name (as `GPTModel.named_parameters`)."""
    if name.startswith(("embedding.", _OUTPUT_PREFIX)):
        return "language_model." + name
    return "language_model.encoder." + name


def megatron_to_plain(name: str) -> str:
    """A Megatron nested parameter name -> the plain GPT name (layers in today's spelling)."""
    for prefix, plain in MEGATRON_PREFIXES.items():
        if name.startswith(prefix):
            rest = name[len(prefix) :]
            if rest.startswith("layers."):
                _, index, local = rest.split(".", 2)
                return layer_name(int(index), canonical_layer_key(local))
            return plain + rest
    raise ValueError(f"parameter {name} is not one of Megatron's GPT names")


def pipeline_to_plain(name: str, num_layers: int, numbering: str = OWN_NUMBERING) -> str:
    """A PipelineModule parameter name -> the plain GPT name (the embedding tied or not)."""
    if name.startswith(TIED_PREFIX):
        return "embedding." + name[len(TIED_PREFIX) :]
    first, final = pipe_layer_indices(num_layers, numbering)
    index, rest = name.split(".", 1)
    position = int(index) - first
    if int(index) == EMBEDDING_INDEX:
        return "embedding." + rest
    if 0 <= position < num_layers:
        return layer_name(position, canonical_layer_key(rest))
    if int(index) == final:
        return "final_layernorm." + rest
    if int(index) == final + 1 and rest.startswith(LM_HEAD):
        return _OUTPUT_PREFIX + rest[len(LM_HEAD) :]
    raise ValueError(f"pipeline parameter {name} is not part of a {num_layers}-layer GPT")


def stage_layers(num_layers: int, num_stages: int) -> list[range]:
    """The transformer layers each pipeline stage holds ("type:transformer" partitioning)."""
    from deepspeed.runtime.utils import partition_balanced

    first_layer, _ = pipe_layer_indices(num_layers)
    weights = [0] * first_layer + [1] * num_layers + [0] * 3  # norm, head, logits slot
    parts = partition_balanced(weights=weights, num_parts=num_stages)
    stages = []
    for stage in range(num_stages):
        first = max(parts[stage] - first_layer, 0)
        last = min(max(parts[stage + 1] - first_layer, 0), num_layers)
        stages.append(range(first, last))
    return stages


def module_parameters(config: GPTConfig, *, stage: int = 0, num_stages: int = 1) -> list[Param]:
    """The parameter-table rows of one stage, in its module's registration order (the pipeline
    registers a tied embedding first, also on the last stage that uses it as head; an untied
    head comes after the final norm)."""
    layers = stage_layers(config.num_layers, num_stages)[stage] if num_stages > 1 else None
    last = stage == num_stages - 1
    tied = not config.untie_embeddings_and_output_weights
    params: list[Param] = []
    if stage == 0 or (num_stages > 1 and last and tied):
        params += embedding_parameters(config)
    for i in layers if layers is not None else range(config.num_layers):
        params += layer_parameters(config, i)
    if last:
        params += final_parameters(config)
        params += head_parameters(config)
    return params


def module_order(config: GPTConfig, *, stage: int = 0, num_stages: int = 1) -> list[str]:
    """Plain names of the parameters one stage holds, in its module's registration order."""
    return [param.name for param in module_parameters(config, stage=stage, num_stages=num_stages)]


def optimizer_order(config: GPTConfig, *, stage: int = 0, num_stages: int = 1) -> list[str]:
    """The order of mds-train's optimizer over one stage: the decayed group, then the rest
    (mds_train.model_setup.parameter_groups takes the same table's `decay`)."""
    params = module_parameters(config, stage=stage, num_stages=num_stages)
    return [p.name for p in params if p.decay] + [p.name for p in params if not p.decay]


def plain_engine_to_plain(name: str) -> str:
    """A parameter name as the plain engine names it -> the plain GPT name: Megatron's nesting
    (upstream's GPTModel, mds-train's TrainingGPT) or, in mds-train's files before it, the plain
    GPT's own."""
    return megatron_to_plain(name) if name.startswith("language_model.") else name


def plain_parameter_name(engine_name: str, *, num_layers: int, pipeline: bool) -> str:
    """The plain GPT name of a parameter as mds-train's engine names it (pipeline or plain)."""
    if pipeline:
        return pipeline_to_plain(engine_name, num_layers)
    return plain_engine_to_plain(engine_name)


def engine_parameter_name(
    name: str, *, num_layers: int, pipeline: bool, untied: bool = False
) -> str:
    """The name mds-train's engine gives a plain GPT parameter (the inverse of
    `plain_parameter_name`): what DeepSpeed's ZeRO files and universal checkpoints key on.
    `untied`: the model's untie_embeddings_and_output_weights (its pipeline's embedding is no
    tied module then)."""
    if not pipeline:
        return plain_to_megatron(name)
    if name.startswith("embedding.") and not untied:
        return TIED_PREFIX + name[len("embedding.") :]
    index, key = pipeline_file_key(name, num_layers, OWN_NUMBERING)
    return f"{index}.{key}"
