"""Parameter count, model FLOPs per token and a per-GPU memory estimate, to plan runs before a job.

FLOPs: the PaLM convention `6N + 12 L h s` (as `reference_gpt.py`) and Megatron's Narayanan et al.
formula of BS `training.py` (`24 f L h^2 s (1 + s/6h + V/16Lh)`, f = 3, or 4 with recompute), its
`24 h^2` written out as the layer's products (query/key/value rows, the output projection, the
MLP's two or, gated, three products) so that grouped-query attention and SwiGLU count as upstream's
throughput_calculator counts them (less its integer `2 // gqa`, which drops the keys and values).
Memory: weights, gradients and Adam states by ZeRO stage (ZeRO paper's 2 + 2 + 12 bytes per
parameter in mixed precision; 2 + 6 + 12 for bf16 at ZeRO 0-1, whose optimizers keep fp32
gradients too, except where mds-train's master-weight optimizer reads the bf16 gradients as they
are: one replica, one micro-batch per step, ZeRO-0, no pipeline), activations per Korthikanti et
al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", Table 2) for tensor
and sequence parallelism.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from . import parameters as table
from .config import GPTConfig, check_tensor_parallel

GIB = 2**30


@dataclass(frozen=True)
class Plan:
    """The parallel layout and batch the estimate is for."""

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    data_parallel_size: int = 1
    micro_batch_size: int = 1
    zero_stage: int = 0
    # None: micro-batch x DP, one micro-batch per replica per step (Megatron's default)
    global_batch_size: int | None = None

    def __post_init__(self) -> None:
        for name in (
            "tensor_model_parallel_size",
            "pipeline_model_parallel_size",
            "data_parallel_size",
            "micro_batch_size",
        ):
            if getattr(self, name) < 1:
                raise ValueError(
                    f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}"
                )
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"--zero-stage must be 0, 1, 2 or 3, got {self.zero_stage}")
        per_step = self.micro_batch_size * self.data_parallel_size
        if self.global_batch_size is not None and (
            self.global_batch_size < 1 or self.global_batch_size % per_step
        ):
            raise ValueError(
                f"--global-batch-size {self.global_batch_size} must be a positive multiple of "
                f"--micro-batch-size x --data-parallel-size ({per_step})"
            )

    @property
    def gradient_accumulation_steps(self) -> int:
        if self.global_batch_size is None:
            return 1
        return self.global_batch_size // (self.micro_batch_size * self.data_parallel_size)


def check_plan(config: GPTConfig, plan: Plan) -> None:
    """Refuses a layout no run can have, naming the flags (ValueError)."""
    check_tensor_parallel(config, plan.tensor_model_parallel_size)
    pp = plan.pipeline_model_parallel_size
    if pp > config.num_layers:
        raise ValueError(
            f"--pipeline-model-parallel-size {pp} exceeds --num-layers {config.num_layers}: "
            "every pipeline stage needs at least one layer; use at most as many stages as layers"
        )
    if pp > 1 and plan.zero_stage >= 2:
        # DeepSpeed's PipelineEngine asserts it: ZeRO-2/3 shard gradients that 1F1B accumulates.
        raise ValueError(
            f"--zero-stage {plan.zero_stage} with --pipeline-model-parallel-size {pp}: DeepSpeed's "
            "pipeline engine supports ZeRO stage 0 or 1 only"
        )


def layer_parameters(config: GPTConfig) -> int:
    """One transformer layer (12h^2 + 13h for GPT-2 with ffn = 4h): parameters.py's rows."""
    return sum(param.numel for param in table.layer_parameters(config))


def embedding_parameters(config: GPTConfig) -> int:
    """The embedding's, and an untied output layer's (vocabulary-sized as the embedding)."""
    params = table.embedding_parameters(config) + table.head_parameters(config)
    return sum(param.numel for param in params)


def total_parameters(config: GPTConfig, *, exclude_embeddings: bool = False) -> int:
    """Whole model, a tied LM head counted once."""
    body = config.num_layers * layer_parameters(config)
    body += sum(param.numel for param in table.final_parameters(config))
    return body if exclude_embeddings else body + embedding_parameters(config)


def flops_per_token(config: GPTConfig) -> dict[str, float]:
    """Training (forward + backward) FLOPs per token under both conventions."""
    L, h, s, V = config.num_layers, config.hidden_size, config.seq_length, config.padded_vocab_size
    mlp_products = 3 if config.gated else 2
    products = h * config.qkv_size + h * h + mlp_products * h * config.ffn_size
    # per token and per pass factor f; GPT-2's 24 L h^2 (1 + s/6h + V/16Lh)
    megatron = 2 * L * products + 4 * L * s * h + 1.5 * V * h
    return {
        "palm_6n_plus_attention": 6 * total_parameters(config) + 12 * L * h * s,
        "megatron_no_recompute": 3 * megatron,
        "megatron_with_recompute": 4 * megatron,
    }


def _stage_parameters(config: GPTConfig, plan: Plan) -> int:
    """Parameters held by the busiest GPU: the first stage (embedding + its share of layers),
    each parameter's TP shard (parameters.py's split)."""
    t = plan.tensor_model_parallel_size

    def on_one_gpu(params) -> int:
        return sum(p.numel if p.split.dim is None else p.numel // t for p in params)

    layers = -(-config.num_layers // plan.pipeline_model_parallel_size)
    count = layers * on_one_gpu(table.layer_parameters(config))
    count += on_one_gpu(table.embedding_parameters(config))
    if plan.pipeline_model_parallel_size == 1:  # else the last stage holds the norm and head
        count += on_one_gpu(table.final_parameters(config) + table.head_parameters(config))
    return count


def activation_bytes_per_layer(
    config: GPTConfig, micro_batch_size: int, tensor_model_parallel_size: int = 1
) -> float:
    """Korthikanti et al. Table 2 with tensor parallelism t (and sequence parallelism, which
    splits the 10 sbh kept outside the TP regions over t too), half-precision activations.

    Flash-attn and SDPA never store the (s x s) scores, probabilities and dropout mask, so the
    `5as/ht` term only counts when attention runs through explicit softmax (ALiBi, or the
    softmax backend).
    """
    s, b, h, a = config.seq_length, micro_batch_size, config.hidden_size, config.num_attention_heads
    t = tensor_model_parallel_size
    mode = config.activation_checkpointing
    sp = config.sequence_parallel
    if mode == "full":
        return 2 * s * b * h / (t if sp else 1)  # only the layer input is kept
    outside = 10 / t if sp else 10
    if mode == "selective" or not config.explicit_attention_scores:
        return s * b * h * (outside + 24 / t)
    return s * b * h * (outside + 24 / t + 5 * a * s / (h * t))


_ALLREDUCE_BUCKET_ELEMENTS = 500_000_000  # DeepSpeed's MEMORY_OPT_ALLREDUCE_SIZE


def _allreduce_bucket_bytes(config: GPTConfig, plan: Plan, params: int) -> int:
    """DeepSpeed's gradient all-reduce with its BF16 optimizer (mds-train's bf16 pipelines at
    ZeRO 0-1), at every DP size: `buffered_allreduce_fallback` flattens the fp32
    gradients into buckets that close once past 5e8 elements (so at most that plus the largest
    tensor) and casts each to bf16 to send: 4 + 2 bytes per element at the peak. Measured on 2
    H200s with 175B-shaped layers (TP=2, DP=2, PP=2), it is what the peak holds beyond the
    persistent figures. Other engines and precisions: not counted (0). `params`: the busiest
    GPU's parameters (a bucket holds no more)."""
    bf16_optimizer = (
        config.params_dtype == "bfloat16"
        and plan.zero_stage <= 1
        and plan.pipeline_model_parallel_size > 1
    )
    if not bf16_optimizer:
        return 0
    t, h = plan.tensor_model_parallel_size, config.hidden_size
    largest = max(config.padded_vocab_size // t, config.ffn_size // t, 3 * h // t) * h
    return min(_ALLREDUCE_BUCKET_ELEMENTS + largest, params) * (4 + 2)


def estimate(config: GPTConfig, plan: Plan) -> dict:
    """All figures for `mds-model info`; memory in bytes for the busiest GPU (pipeline stage 0).
    Layers need not divide evenly over the stages (DeepSpeed balances them): the busiest stage holds
    ceil(L / pp). Raises ValueError for an impossible plan (`check_plan`)."""
    check_plan(config, plan)
    half = config.params_dtype in ("bfloat16", "float16")
    weight_bytes, grad_bytes, optim_bytes = (2, 2, 12) if half else (4, 4, 8)
    params = _stage_parameters(config, plan)
    dp = plan.data_parallel_size
    sharded_grads = plan.zero_stage >= 2
    if config.params_dtype == "bfloat16" and plan.zero_stage == 3 and dp > 1:
        # mds-train's ZeRO-3 above one rank (FSDP2): the fp32 shards are the weights (and the
        # masters), the gradients fp32 shards, the optimizer the two moments; a layer's bf16
        # weights and gradients exist whole only while it runs (not counted).
        weight_bytes, grad_bytes, optim_bytes = 4, 4, 8
    elif config.params_dtype == "bfloat16" and (plan.zero_stage <= 2 or dp == 1):
        # mds-train's bf16 optimizers (MasterWeightAdamW at ZeRO-0 and at ZeRO-3 on one rank,
        # ShardedMasterAdamW at ZeRO-1/2 without a pipeline; DeepSpeed's BF16 optimizer in a
        # pipeline) accumulate into a full-size fp32 gradient buffer beside the bf16 gradients;
        # ShardedMasterAdamW's ZeRO-2 above one rank keeps only its partition of it.
        own = plan.pipeline_model_parallel_size == 1  # always at ZeRO-2 (check_plan)
        grad_bytes, sharded_grads = 2 + 4, False
        if plan.zero_stage == 2:  # the bf16 gradients whole, the fp32 ones partitioned
            grad_bytes = 2 + 4 / dp
        one_replica_one_micro_batch = (
            plan.data_parallel_size == 1 and plan.gradient_accumulation_steps == 1
        )
        if own and one_replica_one_micro_batch:
            # Nothing to accumulate or average: the Triton step reads the bf16 gradients as
            # backward left them, and no fp32 buffer exists (on a GPU; mds_train.model_setup
            # sets up no reduce_in_backward there).
            grad_bytes = 2
    weights = params * weight_bytes / (dp if plan.zero_stage >= 3 else 1)
    grads = params * grad_bytes / (dp if sharded_grads else 1)
    optimizer = params * optim_bytes / (dp if plan.zero_stage >= 1 else 1)
    # With 1F1B the first stage holds pp micro-batches of L/pp layers: L layers' worth in all.
    t = plan.tensor_model_parallel_size
    activations = config.num_layers * activation_bytes_per_layer(config, plan.micro_batch_size, t)
    s, b = config.seq_length, plan.micro_batch_size
    logits = s * b * config.padded_vocab_size / t * weight_bytes
    activations += logits
    buffers = _allreduce_bucket_bytes(config, plan, params)
    return {
        "config": asdict(config),
        "plan": asdict(plan),
        "padded_vocab_size": config.padded_vocab_size,
        "parameters": total_parameters(config),
        "parameters_without_embeddings": total_parameters(config, exclude_embeddings=True),
        "parameters_per_gpu": params,
        "gradient_accumulation_steps": plan.gradient_accumulation_steps,
        "flops_per_token": flops_per_token(config),
        "memory_bytes_per_gpu": {
            "weights": weights,
            "gradients": grads,
            "optimizer": optimizer,
            "activations": activations,
            "buffers": buffers,
            "total": weights + grads + optimizer + activations + buffers,
        },
    }


def format_estimate(result: dict) -> str:
    """A human-readable summary, one figure per line."""
    mem = result["memory_bytes_per_gpu"]
    flops = result["flops_per_token"]
    plan = result["plan"]
    cfg = result["config"]
    lines = [
        f"padded vocab size        {result['padded_vocab_size']}",
        f"parameters               {result['parameters']:,} ({result['parameters'] / 1e6:.1f}M)",
        f"  without embeddings     {result['parameters_without_embeddings']:,}",
        f"  on the busiest GPU     {result['parameters_per_gpu']:,}",
        f"FLOPs per token (6N+12Lhs)          {flops['palm_6n_plus_attention'] / 1e9:.3f} GFLOP",
        f"FLOPs per token (Megatron, f=3)     {flops['megatron_no_recompute'] / 1e9:.3f} GFLOP",
        f"FLOPs per token (Megatron, f=4)     {flops['megatron_with_recompute'] / 1e9:.3f} GFLOP",
        f"memory per GPU (TP={plan['tensor_model_parallel_size']} "
        f"PP={plan['pipeline_model_parallel_size']} "
        f"DP={plan['data_parallel_size']} micro-batch={plan['micro_batch_size']} "
        f"accumulation={result['gradient_accumulation_steps']} "
        f"ZeRO-{plan['zero_stage']}, {cfg['params_dtype']}, "
        f"checkpointing {cfg['activation_checkpointing']}):",
    ]
    for key in ("weights", "gradients", "optimizer", "activations", "buffers", "total"):
        lines.append(f"  {key:<12} {mem[key] / GIB:8.2f} GiB")
    return "\n".join(lines)
