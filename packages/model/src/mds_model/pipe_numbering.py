"""Where each fork's GPTModelPipe puts the embedding, the transformer layers and the final norm
in its spec list: the `layer_XX` numbers of its checkpoint files and the `{XX}.name` parameter
names of DeepSpeed's pipeline engine. Torch-free, so checkpoint readers use it without DeepSpeed.

Spec 0 is a cast, 1 the embedding; then the transformer layers one after another and the final
norm, each block `gap` after the one before. bigscience's fork puts a transpose lambda between
them (gap 2: layers 3..N+2, norm N+4); deepspeedai/Megatron-DeepSpeed's
(megatron/model/gpt_model.py) does not (gap 1: layers 2..N+1, norm N+2). mds_model's pipeline
numbers as deepspeedai's does, so that fork's `pretrain_gpt.py --load` reads mds-train's files.
"""

from __future__ import annotations

PIPE_GAPS = {"bigscience": 2, "deepspeedai": 1}
EMBEDDING_INDEX = 1
OWN_NUMBERING = "deepspeedai"


def pipe_layer_indices(num_layers: int, numbering: str = OWN_NUMBERING) -> tuple[int, int]:
    """(spec index of the first transformer layer, of the final norm) in a fork's numbering."""
    gap = PIPE_GAPS[numbering]
    first = EMBEDDING_INDEX + gap
    return first, first + num_layers - 1 + gap


def pipe_numbering(indices: list[int]) -> str | None:
    """Which fork's GPTModelPipe numbered these layer files (embedding, layers, final norm, in
    order); None when neither did."""
    num_layers = len(indices) - 2
    for numbering in PIPE_GAPS:
        first, final = pipe_layer_indices(num_layers, numbering)
        if indices == [EMBEDDING_INDEX, *range(first, first + num_layers), final]:
            return numbering
    return None


def renumber(index: int, num_layers: int, *, source: str, target: str) -> int:
    """A spec index holding parameters in `source`'s numbering -> the same part's in `target`'s."""
    first, final = pipe_layer_indices(num_layers, source)
    target_first, target_final = pipe_layer_indices(num_layers, target)
    if index == EMBEDDING_INDEX:
        return EMBEDDING_INDEX
    if first <= index < first + num_layers:
        return target_first + index - first
    if index == final:
        return target_final
    raise ValueError(f"spec index {index} holds no parameters of a {num_layers}-layer GPTModelPipe")
