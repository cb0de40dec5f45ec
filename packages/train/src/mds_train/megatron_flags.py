"""Megatron-DeepSpeed's `pretrain_gpt.py` flags that are not mds-train's own: the tables of those
accepted and ignored (`IGNORED`, each one given named once) and of those refused (`REFUSED`, one
usage line saying what mds-train does instead), and `classify`, which reads the three tables
(declared, ignored, refused) for `scripts/upstream_flags.py` and the README's flag table.

Names and value counts follow upstream's `megatron/arguments.py`; a flag that upstream reads only
when another one is on (the MoE and distillation details) is ignored, and its switch refused.
"""

from __future__ import annotations

import inspect
from typing import Any, NamedTuple

from mds_common.ignored_flags import MANY, IgnoredFlags, RefusedFlags, ignored, refused

_ACTIVATIONS = "activation checkpointing is mds_model's own"
_FUSION = "use --no-fused-kernels to turn every kernel off"
_KERNEL = "a kernel or overlap switch of Megatron's own layers; it changes no result"
_MOE = "read only with --num-experts > 1 (mixture-of-experts), which mds-train does not train"
_KD = "read only with --kd (knowledge distillation), which mds-train does not do"
_WANDB = "Weights & Biases is not built in; metrics.jsonl and TensorBoard get the scalars"
_EFFICIENCY = (
    "DeepSpeed's data-efficiency pipeline (curriculum, random-LTD, its own sample indexes) is not "
    "supported; mds-train reads the sample-index caches of mds-index (--data-cache-path)"
)
IGNORED = IgnoredFlags(
    [
        ignored("--deepspeed", why="DeepSpeed is always on", nargs=0),
        ignored("--data-impl", "--dataset-impl", why="mmap is the only dataset format"),
        ignored("--DDP-impl", why="DeepSpeed's engine does data parallelism"),
        # The deepspeed launcher adds it beside LOCAL_RANK: noted only when the two differ.
        ignored(
            "--local_rank",
            "--local-rank",
            why="the local rank comes from the LOCAL_RANK environment variable",
            env="LOCAL_RANK",
        ),
        ignored("--codecarbon-dir", why="energy tracking is not built in"),
        # Upstream wraps the loader in RepeatingLoader, which restarts it once exhausted; the
        # sample index holds the epochs --train-iters needs (Megatron's num_epochs), as upstream's
        # GPT dataset does, so the loader never runs out.
        ignored(
            "--repeated-dataloader",
            why="the sample index already holds every epoch --train-iters needs",
            nargs=0,
        ),
        ignored(
            "--transformer-impl",
            why="mds_model's own layers run FP8 (--fp8-e4m3/--fp8-hybrid) and keep the local "
            "layers' parameter names",
        ),
        ignored("--partition-activations", why=_ACTIVATIONS, nargs=0),
        ignored("--deepspeed-activation-checkpointing", why=_ACTIVATIONS, nargs=0),
        ignored("--contigious-checkpointing", why=_ACTIVATIONS, nargs=0),
        ignored("--checkpoint-in-cpu", why=_ACTIVATIONS, nargs=0),
        ignored("--synchronize-each-layer", why=_ACTIVATIONS, nargs=0),
        ignored("--no-masked-softmax-fusion", why=_FUSION, nargs=0),
        ignored("--no-bias-dropout-fusion", why=_FUSION, nargs=0),
        ignored("--no-gradient-accumulation-fusion", why=_KERNEL, nargs=0),
        ignored("--no-async-tensor-model-parallel-allreduce", why=_KERNEL, nargs=0),
        ignored(
            "--use-flash-attn-triton",
            why=(
                "mds_model chooses its attention kernel (--use-flash-attn for flash-attn, "
                "--attention-backend fused for cuDNN's)"
            ),
            nargs=0,
        ),
        ignored(
            "--no-query-key-layer-scaling",
            why="the scaling only changes fp16 rounding; mds_model's softmax is in fp32",
            nargs=0,
        ),
        ignored(
            "--cpu_torch_adam",
            why="mds-train's Adam is torch's AdamW (decoupled weight decay) on every device",
            nargs=0,
        ),
        ignored(
            "--ds_fused_adam",
            why="mds-train's Adam is torch's AdamW unless the DeepSpeed file names another",
            nargs=0,
        ),
        ignored(
            "--tensorboard-log-interval", why="TensorBoard scalars are written every --log-interval"
        ),
        ignored("--timing-log-level", why="the interval line times each iteration"),
        ignored("--wandb-project", why=_WANDB),
        ignored("--wandb-exp-name", why=_WANDB),
        ignored("--wandb-save-dir", why=_WANDB),
        ignored(
            "--num-workers", why="the data loader reads memory-mapped samples in the main process"
        ),
        ignored(
            "--pipeline-model-parallel-impl", why="the DeepSpeed pipeline engine is the only one"
        ),
        ignored(
            "--no-pipeline-parallel",
            why="--pipeline-model-parallel-size 1 uses the plain engine",
            nargs=0,
        ),
        ignored(
            "--enable-zbh1-pipeline",
            why="pipelines run DeepSpeed's 1F1B schedule (the same steps)",
            nargs=0,
        ),
        ignored(
            "--enable-zbh1-exact-semantics",
            why="pipelines run DeepSpeed's 1F1B schedule (the same steps)",
            nargs=0,
        ),
        ignored("--cpu-optimizer", why="offload the optimizer in the DeepSpeed config", nargs=0),
        ignored(
            "--no-load-lr-state",
            why="Megatron-DeepSpeed declares it and never reads it (its scheduler state always "
            "loads); --override-opt_param-scheduler takes the schedule from the flags",
            nargs=0,
        ),
        ignored("--moe-expert-parallel-size", why=_MOE),
        ignored("--moe-loss-coeff", why=_MOE),
        ignored("--moe-train-capacity-factor", why=_MOE),
        ignored("--moe-eval-capacity-factor", why=_MOE),
        ignored("--moe-min-capacity", why=_MOE),
        ignored("--disable-moe-token-dropping", why=_MOE, nargs=0),
        ignored("--create-moe-param-group", why=_MOE, nargs=0),
        ignored("--load-teacher", why=_KD),
        ignored("--num-layers-teacher", why=_KD),
        ignored("--hidden-size-teacher", why=_KD),
        ignored("--num-attention-heads-teacher", why=_KD),
        ignored("--num-experts-teacher", why=_KD, nargs=MANY),
        ignored("--kd-beta-ce", why=_KD),
    ]
)

REFUSED = RefusedFlags(
    [
        refused(
            "--num-experts",
            why="mixture-of-experts is not supported; mds-train trains dense GPTs",
            nargs=MANY,
            allowed=("1",),
            harmless="one expert per layer is the dense GPT mds-train trains",
        ),
        refused(
            "--mlp-type",
            why="only the standard MLP (residual MoE is not supported)",
            allowed=("standard",),
            harmless="the standard MLP is mds_model's",
        ),
        refused("--kd", why="knowledge distillation is not supported", nargs=0),
        refused("--mos", why="mixture-of-students distillation is not supported", nargs=0),
        refused(
            "--ds-sequence-parallel-size",
            why="DeepSpeed-Ulysses sequence parallelism is not supported; "
            "--sequence-parallel is Megatron's, with tensor parallelism",
            allowed=("1",),
            harmless="one sequence-parallel rank is no sequence parallelism",
        ),
        refused(
            "--vocab-extra-ids",
            why="SentencePieceTokenizer's <extra_id_N> specials (T5's) are not supported",
            allowed=("0",),
            harmless="no extra ids is upstream's default",
        ),
        refused(
            "--trust-remote-code",
            why="a tokenizer's remote code is never run; save the tokenizer as a tokenizer.json "
            "folder (AutoTokenizer.from_pretrained(X).save_pretrained(DIR)) and pass that",
            nargs=0,
        ),
        refused(
            "--inference",
            why="mds-train only trains; mds-generate runs a checkpoint",
            nargs=0,
        ),
        refused(
            "--reset-iteration",
            why="not supported; --finetune loads the weights and starts at iteration 0 "
            "(without the optimizer state)",
            nargs=0,
        ),
        refused("--random-ltd", why=_EFFICIENCY, nargs=0),
        refused("--data-efficiency-curriculum-learning", why=_EFFICIENCY, nargs=0),
        refused("--train-data-exact-num-epochs", why=_EFFICIENCY),
        refused("--return-data-index", why=_EFFICIENCY, nargs=0),
        refused("--train-idx-path", why=_EFFICIENCY),
        refused("--train-doc-idx-path", why=_EFFICIENCY),
        refused("--train-sample-idx-path", why=_EFFICIENCY),
        refused("--train-shuffle-idx-path", why=_EFFICIENCY),
    ]
)


def megatron_parameters() -> list[inspect.Parameter]:
    """Hidden options for the Megatron flags mds-train ignores or refuses."""
    return [*IGNORED.parameters(), *REFUSED.parameters()]


def megatron_flags_given(values: dict[str, Any]) -> list[str]:
    """The notes for the ignored flags given; a refused one given ends the command line with a
    usage error (exit 2) naming it and what mds-train does instead."""
    return [*REFUSED.check(values), *IGNORED.notes(values)]


class Classification(NamedTuple):
    status: str  # "works", "ignored", "refused" or "unknown"
    detail: str  # the ignored note's reason or the refusal, else ""


def _key(name: str) -> str:
    return name.replace("_", "-").lower()


def declared_flags() -> set[str]:
    """Every spelling of mds-train's own flags (config sections and --config), as keys."""
    from mds_common.flags import flag_fields

    from .cli import PRESET_FLAG
    from .config import SECTIONS

    names = {_key(PRESET_FLAG)}
    for section in SECTIONS.values():
        for _, spec in flag_fields(section):
            names.update(_key(name) for name in spec.names)
    return names


def classify(name: str) -> Classification:
    """What mds-train does with the flag `name` (argparse spelling, `_` and `-` alike)."""
    key = _key(name)
    if key in declared_flags():
        return Classification("works", "")
    for flag in IGNORED.flags:
        if key in {_key(n) for n in flag.names}:
            return Classification("ignored", flag.why)
    for flag in REFUSED.flags:
        if key in {_key(n) for n in flag.names}:
            allowed = " or ".join(flag.allowed)
            unless = f" (accepted and ignored as {allowed}: {flag.harmless})" if allowed else ""
            return Classification("refused", flag.why + unless)
    return Classification("unknown", "")
