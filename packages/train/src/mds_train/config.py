"""The trainer's frozen configuration: one section per concern, each field a Megatron flag.

Spellings and defaults are Megatron-DeepSpeed's `arguments.py` where it has the flag (README:
"Flags"); `TrainConfig.validate()` checks what involves several sections, naming the flags.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from mds_common.flags import flag, restate
from mds_indexed_data.flags import DataFlags, LengthFlags, SeedFlags
from mds_model import GPTConfig, for_tensor_parallel
from mds_model.flags import (
    Fp8Flags,
    GPTFlags,
    HalfFlags,
    MicroBatchFlags,
    ParallelFlags,
    check_at_least,
)
from mds_tokenize.flags import TokenizerFlags

from .profiling import ProfilerFlags
from .schedule import (
    DECAY_STYLES,
    BatchSizeSchedule,
    LearningRateSchedule,
    TokenLearningRateSchedule,
)

# Megatron-LM's --attention-backend values -> GPTConfig.attention_backend. Its `fused` is
# Transformer Engine's cuDNN fused attention, here cuDNN's through SDPA; `unfused` (TE's) and
# `local` (Megatron's own) both compute explicit scores through the fused masked softmax.
ATTENTION_BACKEND_OF_FLAG = {
    "auto": "auto",
    "flash": "flash",
    "fused": "cudnn",
    "unfused": "softmax",
    "local": "softmax",
}


@dataclass(frozen=True, kw_only=True)
class ModelSection(GPTFlags):
    num_layers: int = restate(GPTFlags, "num_layers", required=True)
    hidden_size: int = restate(GPTFlags, "hidden_size", required=True)
    num_attention_heads: int = restate(GPTFlags, "num_attention_heads", required=True)
    seq_length: int = restate(GPTFlags, "seq_length", required=True)
    init_method_std: float = flag("--init-method-std", default=0.02, help="Weight init std.")
    hidden_dropout: float = flag("--hidden-dropout", default=0.1, help="Dropout on hidden states.")
    attention_dropout: float = flag(
        "--attention-dropout", default=0.1, help="Dropout on attention probabilities."
    )
    checkpoint_activations: bool = flag(
        "--checkpoint-activations", default=False, help="Recompute each layer in backward."
    )
    recompute_granularity: str | None = flag(
        "--recompute-granularity",
        choices=("full", "selective"),
        help="Activation recomputation: full layers, or only attention's core.",
    )
    # Upstream's knobs for full recompute; mds_model checkpoints each layer on its own, which is
    # upstream's `uniform` with units of 1 layer (its default): other values are refused.
    recompute_method: str | None = flag(
        "--recompute-method",
        choices=("uniform", "block"),
        help="With --recompute-granularity full: uniform (each layer; the only method here).",
    )
    recompute_num_layers: int = flag(
        "--recompute-num-layers",
        default=1,
        help="Layers per recomputed unit with --recompute-method uniform (1, the only one here).",
    )
    use_flash_attn: bool = flag(
        "--use-flash-attn", default=False, help="Attention through flash-attn (must be installed)."
    )
    attention_backend: str = flag(
        "--attention-backend",
        default="auto",
        choices=tuple(ATTENTION_BACKEND_OF_FLAG),
        help=(
            "Megatron-LM's: fused (cuDNN's fused attention, through SDPA), flash (flash-attn), "
            "unfused or local (explicit softmax), auto (flash-attn if installed, else SDPA)."
        ),
    )
    # CUDA graphs are on by default wherever `cuda_graph_problem` finds nothing in the way.
    enable_cuda_graph: bool = flag(
        "--enable-cuda-graph",
        default=False,
        help=(
            "Replay each transformer layer's forward and backward as CUDA graphs (Megatron-LM's), "
            "and refuse the run where they cannot be (by default: wherever they can)."
        ),
    )
    no_cuda_graph: bool = flag(
        "--no-cuda-graph",
        default=False,
        help="Launch every layer's kernels from Python (the default graphs them where it can).",
    )
    no_fused_kernels: bool = flag(
        "--no-fused-kernels",
        default=False,
        help="Pure-torch paths instead of Triton kernels (the model's and the bf16 optimizer's).",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        method, num_layers = self.recompute_method, self.recompute_num_layers
        if method is not None and self.recompute_granularity == "selective":
            raise ValueError(  # upstream's validate_args asserts the same
                "--recompute-method applies to --recompute-granularity full, not selective; drop it"
            )
        if method == "block":
            raise ValueError(
                "--recompute-method block (recompute only the first --recompute-num-layers layers "
                "of each stage) is not supported: mds_model recomputes every layer; use "
                "--recompute-method uniform --recompute-num-layers 1, or --recompute-granularity "
                "selective to save less memory for less recompute"
            )
        if num_layers != 1:
            raise ValueError(
                f"--recompute-num-layers {num_layers}: mds_model recomputes each layer on its own "
                "(upstream's uniform method with units of 1 layer); use --recompute-num-layers 1"
            )
        if self.use_flash_attn and self.attention_backend not in ("auto", "flash"):
            raise ValueError(
                f"--use-flash-attn and --attention-backend {self.attention_backend} name two "
                "attention backends: give one"
            )

    def gpt_config(
        self,
        *,
        vocab_size: int,
        tensor_model_parallel_size: int,
        params_dtype: str,
        kernels_available: bool = True,
    ) -> GPTConfig:
        """The model a run at this TP makes; Triton kernels only where they can run (a GPU) and
        not refused."""
        checkpointing = self.recompute_granularity or (
            "full" if self.checkpoint_activations else "none"
        )
        model = GPTConfig(
            **self.gpt_fields(),
            vocab_size=vocab_size,
            hidden_dropout=self.hidden_dropout,
            attention_dropout=self.attention_dropout,
            init_method_std=self.init_method_std,
            use_fused_kernels=kernels_available and not self.no_fused_kernels,
            attention_backend="flash"
            if self.use_flash_attn
            else ATTENTION_BACKEND_OF_FLAG[self.attention_backend],
            activation_checkpointing=checkpointing,
            params_dtype=params_dtype,
        )
        return for_tensor_parallel(model, tensor_model_parallel_size)


@dataclass(frozen=True, kw_only=True)
class ParallelSection(ParallelFlags):
    distributed_backend: str | None = flag(
        "--distributed-backend",
        choices=("nccl", "gloo"),
        help="Collectives backend; default nccl on GPUs, gloo on CPU.",
    )
    distributed_timeout_minutes: int | None = flag(
        "--distributed-timeout-minutes",
        help="Minutes a collective waits for a rank (unset: 10, or DEEPSPEED_TIMEOUT).",
    )
    deepspeed_config: Path | None = flag(
        "--deepspeed_config",
        "--deepspeed-config",
        help="DeepSpeed JSON merged over the one derived from these flags.",
    )


@dataclass(frozen=True, kw_only=True)
class BatchSection:
    micro_batch_size: int = restate(MicroBatchFlags, "micro_batch_size", required=True)
    global_batch_size: int | None = restate(
        LengthFlags, "global_batch_size", note="Micro x DP when omitted."
    )
    rampup_batch_size: tuple[int, int, int] | None = flag(
        "--rampup-batch-size",
        nargs=3,
        help="START INCREMENT SAMPLES: grow the global batch linearly (with --train-samples).",
    )
    train_iters: int | None = restate(LengthFlags, "train_iters")
    train_samples: int | None = restate(LengthFlags, "train_samples")
    train_tokens: int | None = flag(
        "--train-tokens", help="Also stop once this many tokens are consumed (of all runs)."
    )

    def __post_init__(self) -> None:
        check_at_least(self, 1, "micro_batch_size", "global_batch_size")
        check_at_least(self, 0, "train_iters", "train_samples")


@dataclass(frozen=True, kw_only=True)
class OptimizerSection:
    optimizer: str = flag(
        "--optimizer", default="adam", choices=("adam", "sgd"), help="AdamW or SGD."
    )
    lr: float = flag("--lr", required=True, help="Peak learning rate.")
    min_lr: float = flag("--min-lr", default=0.0, help="Learning rate at the end of the decay.")
    lr_decay_style: str = flag(
        "--lr-decay-style", default="linear", choices=DECAY_STYLES, help="Decay after the warmup."
    )
    lr_decay_iters: int | None = flag("--lr-decay-iters", help="Decay length in iterations.")
    lr_decay_samples: int | None = flag("--lr-decay-samples", help="Decay length in samples.")
    lr_warmup_fraction: float | None = flag(
        "--lr-warmup-fraction", help="Warmup as a fraction of the decay length."
    )
    lr_warmup_iters: int = flag("--lr-warmup-iters", default=0, help="Warmup in iterations.")
    lr_warmup_samples: int = flag("--lr-warmup-samples", default=0, help="Warmup in samples.")
    lr_decay_tokens: int | None = flag(
        "--lr-decay-tokens", help="Decay length in tokens (instead of iterations or samples)."
    )
    lr_warmup_tokens: int | None = flag("--lr-warmup-tokens", help="Warmup in tokens.")
    weight_decay: float = flag(
        "--weight-decay", default=0.01, help="Decoupled decay (not on biases and norms)."
    )
    clip_grad: float = flag("--clip-grad", default=1.0, help="Global gradient-norm clip (0: off).")
    adam_beta1: float = flag("--adam-beta1", default=0.9, help="Adam beta1.")
    adam_beta2: float = flag("--adam-beta2", default=0.999, help="Adam beta2.")
    adam_eps: float = flag("--adam-eps", default=1e-8, help="Adam epsilon.")
    sgd_momentum: float = flag("--sgd-momentum", default=0.9, help="SGD momentum.")


@dataclass(frozen=True, kw_only=True)
class PrecisionSection(Fp8Flags):
    fp16: bool = restate(HalfFlags, "fp16", note="Dynamic loss scaling.")
    bf16: bool = restate(HalfFlags, "bf16", note="fp32 master weights.")
    loss_scale: float | None = flag(
        "--loss-scale", help="Static fp16 loss scale (dynamic if unset)."
    )
    initial_loss_scale: float = flag(
        "--initial-loss-scale", default=2.0**32, help="First dynamic loss scale."
    )
    min_loss_scale: float = flag("--min-loss-scale", default=1.0, help="Smallest dynamic scale.")
    loss_scale_window: int = flag(
        "--loss-scale-window", default=1000, help="Clean steps before the scale grows."
    )
    hysteresis: int = flag("--hysteresis", default=2, help="Overflows tolerated before shrinking.")
    grad_reduce_in_bf16: bool = flag(
        "--grad-reduce-in-bf16",
        default=False,
        help="Average data-parallel gradients in bf16 (half the traffic; default fp32).",
    )
    seed: int = restate(SeedFlags, "seed", note="Also of the weights and dropout.")


@dataclass(frozen=True, kw_only=True)
class DataSection(DataFlags, TokenizerFlags):
    eod_mask_loss: bool = flag(
        "--eod-mask-loss", default=False, help="No loss on end-of-document positions."
    )


@dataclass(frozen=True, kw_only=True)
class CheckpointSection:
    save: Path | None = flag("--save", help="Checkpoint folder.")
    load: Path | None = flag(
        "--load", help="Resume from a --save folder's `latest` checkpoint, or one global_stepN."
    )
    save_interval: int | None = flag("--save-interval", help="Save every N iterations.")
    no_load_optim: bool = flag(
        "--no-load-optim", default=False, help="Load weights, fresh optimizer."
    )
    no_load_rng: bool = flag("--no-load-rng", default=False, help="Do not restore RNG states.")
    finetune: bool = flag(
        "--finetune", default=False, help="Load weights only; iteration and data restart at 0."
    )
    allow_tokenizer_change: bool = flag(
        "--allow-tokenizer-change",
        default=False,
        help="--load a checkpoint trained with another tokenizer than the flags name, on "
        "purpose; every id must still have an embedding row. Without it that is refused.",
    )
    universal_checkpoint: bool = flag(
        "--universal-checkpoint",
        default=False,
        help="--load DeepSpeed's universal checkpoint (its latest_universal) at any TP/PP/DP.",
    )
    exit_on_missing_checkpoint: bool = flag(
        "--exit-on-missing-checkpoint",
        default=False,
        help="A --load with no checkpoint yet (--load = --save) is an error, not a fresh start.",
    )
    override_opt_param_scheduler: bool = flag(
        "--override-opt_param-scheduler",
        "--override-lr-scheduler",
        default=False,
        help="Resume with the flags' schedule, whatever the checkpoint recorded.",
    )
    use_checkpoint_opt_param_scheduler: bool = flag(
        "--use-checkpoint-opt_param-scheduler",
        "--use-checkpoint-lr-scheduler",
        default=False,
        help="Resume with the schedule the checkpoint recorded, whatever the flags say.",
    )


@dataclass(frozen=True, kw_only=True)
class LoggingSection:
    log_interval: int = flag("--log-interval", default=100, help="Iterations between log lines.")
    eval_interval: int = restate(LengthFlags, "eval_interval")
    eval_iters: int = restate(LengthFlags, "eval_iters")
    tensorboard_dir: Path | None = flag("--tensorboard-dir", help="Write TensorBoard events here.")
    tensorboard_queue_size: int = flag(
        "--tensorboard-queue-size", default=1000, help="Events queued before a flush."
    )
    log_timers_to_tensorboard: bool = flag(
        "--log-timers-to-tensorboard", default=False, help="Iteration time and throughput too."
    )
    log_batch_size_to_tensorboard: bool = flag(
        "--log-batch-size-to-tensorboard", default=False, help="Global batch size too."
    )
    log_validation_ppl_to_tensorboard: bool = flag(
        "--log-validation-ppl-to-tensorboard", default=False, help="Validation perplexity too."
    )
    log_optimizer_states_to_tensorboard: bool = flag(
        "--log-optimizer-states-to-tensorboard",
        default=False,
        help="Norms and extremes of Adam's moments and the weights too.",
    )
    output_dir: Path | None = flag(
        "--output-dir", help="metrics.jsonl and the resolved config (default: --save)."
    )
    peak_tflops: float | None = flag(
        "--peak-tflops", help="Per-GPU peak for MFU (default: known GPUs' dense bf16/fp16)."
    )

    def __post_init__(self) -> None:
        check_at_least(self, 1, "log_interval", "eval_interval")
        check_at_least(self, 0, "eval_iters")


@dataclass(frozen=True, kw_only=True)
class ExitSection:
    exit_interval: int | None = flag("--exit-interval", help="Save and exit at iteration % N == 0.")
    exit_duration_in_mins: float | None = flag(
        "--exit-duration-in-mins",
        help="Save and exit after this many minutes of the run; 0 means no limit.",
    )
    kill_switch_path: Path | None = flag(
        "--kill-switch-path", help="Save and exit when this file appears."
    )
    max_nan_iterations: int = flag(
        "--max-nan-iterations",
        default=10,
        help="Stop (without saving) after this many NaN-loss iterations in a row.",
    )

    def __post_init__(self) -> None:
        check_at_least(self, 1, "max_nan_iterations")


SECTIONS = {
    "model": ModelSection,
    "parallel": ParallelSection,
    "batch": BatchSection,
    "optimizer": OptimizerSection,
    "precision": PrecisionSection,
    "data": DataSection,
    "checkpoint": CheckpointSection,
    "logging": LoggingSection,
    "exit": ExitSection,
    "profiler": ProfilerFlags,
}


@dataclass(frozen=True, kw_only=True)
class Topology:
    """Where the ranks go: world = pp x dp x tp."""

    world_size: int
    tensor_model_parallel_size: int
    pipeline_model_parallel_size: int

    @property
    def data_parallel_size(self) -> int:
        return self.world_size // (
            self.tensor_model_parallel_size * self.pipeline_model_parallel_size
        )


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    model: ModelSection
    parallel: ParallelSection
    batch: BatchSection
    optimizer: OptimizerSection
    precision: PrecisionSection
    data: DataSection
    checkpoint: CheckpointSection
    logging: LoggingSection
    exit: ExitSection
    profiler: ProfilerFlags = dataclasses.field(default_factory=ProfilerFlags)

    @property
    def params_dtype(self) -> str:
        return (
            "float16" if self.precision.fp16 else "bfloat16" if self.precision.bf16 else "float32"
        )

    def topology(self, world_size: int) -> Topology:
        tp = self.parallel.tensor_model_parallel_size
        pp = self.parallel.pipeline_model_parallel_size
        if tp < 1 or pp < 1 or world_size % (tp * pp):
            raise ValueError(
                f"the world of {world_size} processes is not divisible by "
                f"--tensor-model-parallel-size ({tp}) x --pipeline-model-parallel-size ({pp})"
            )
        return Topology(
            world_size=world_size, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp
        )

    def global_batch_size(self, topology: Topology) -> int:
        return (
            self.batch.global_batch_size
            or self.batch.micro_batch_size * topology.data_parallel_size
        )

    def batch_schedule(self, topology: Topology) -> BatchSizeSchedule:
        return BatchSizeSchedule(
            global_batch_size=self.global_batch_size(topology),
            micro_batch_size=self.batch.micro_batch_size,
            data_parallel_size=topology.data_parallel_size,
            rampup=self.batch.rampup_batch_size,
        )

    def train_iters(self, topology: Topology) -> int:
        if self.batch.train_iters is not None:
            return self.batch.train_iters
        return self.batch_schedule(topology).iterations_for(self.batch.train_samples)

    def lr_schedule(self, topology: Topology) -> LearningRateSchedule | TokenLearningRateSchedule:
        """Megatron's schedule from the flags (README: "Learning-rate schedule"): in samples, or
        Megatron-DeepSpeed's token variant when a length is given in tokens."""
        samples = self.sample_lr_schedule(topology)
        opt = self.optimizer
        if opt.lr_warmup_tokens is None and opt.lr_decay_tokens is None:
            return samples
        return TokenLearningRateSchedule(
            samples=samples, warmup_tokens=opt.lr_warmup_tokens, decay_tokens=opt.lr_decay_tokens
        )

    def sample_lr_schedule(self, topology: Topology) -> LearningRateSchedule:
        """Megatron's AnnealingLR lengths, in samples."""
        opt, gbs = self.optimizer, self.global_batch_size(topology)
        if self.batch.train_iters is not None:
            decay = (opt.lr_decay_iters or self.batch.train_iters) * gbs
            warmup = opt.lr_warmup_iters * gbs
        else:
            decay = opt.lr_decay_samples or self.batch.train_samples
            warmup = opt.lr_warmup_samples
        if opt.lr_warmup_fraction is not None:
            warmup = int(opt.lr_warmup_fraction * decay)
        return LearningRateSchedule(
            max_lr=opt.lr,
            min_lr=opt.min_lr,
            warmup_samples=warmup,
            decay_samples=decay,
            decay_style=opt.lr_decay_style,
        )

    def validate(self, topology: Topology) -> None:
        """Cross-flag checks; each error names the flags to change."""
        batch, opt, precision = self.batch, self.optimizer, self.precision
        if (batch.train_iters is None) == (batch.train_samples is None):
            raise ValueError("give exactly one of --train-iters and --train-samples")
        if batch.rampup_batch_size is not None and batch.train_iters is not None:
            raise ValueError("--rampup-batch-size needs --train-samples (as Megatron)")
        if batch.train_iters is not None and opt.lr_decay_samples is not None:
            raise ValueError("with --train-iters give --lr-decay-iters, not --lr-decay-samples")
        if batch.train_samples is not None and opt.lr_decay_iters is not None:
            raise ValueError("with --train-samples give --lr-decay-samples, not --lr-decay-iters")
        # Megatron's validate_args asserts these too: the other unit's warmup would be ignored.
        if batch.train_iters is not None and opt.lr_warmup_samples:
            raise ValueError("with --train-iters give --lr-warmup-iters, not --lr-warmup-samples")
        if batch.train_samples is not None and opt.lr_warmup_iters:
            raise ValueError("with --train-samples give --lr-warmup-samples, not --lr-warmup-iters")
        if opt.lr_warmup_fraction is not None and (opt.lr_warmup_iters or opt.lr_warmup_samples):
            raise ValueError("give --lr-warmup-fraction or --lr-warmup-iters/samples, not both")
        if batch.train_tokens is not None and batch.train_tokens < 1:
            raise ValueError("--train-tokens must be >= 1")
        if self.checkpoint.override_opt_param_scheduler and (
            self.checkpoint.use_checkpoint_opt_param_scheduler
        ):
            raise ValueError(
                "give --override-opt_param-scheduler or --use-checkpoint-opt_param-scheduler, "
                "not both"
            )
        timeout = self.parallel.distributed_timeout_minutes
        if timeout is not None and timeout < 1:
            raise ValueError("--distributed-timeout-minutes must be >= 1")
        if precision.fp16 and precision.bf16:
            raise ValueError("give --fp16 or --bf16, not both")
        own_reduction = (  # ds_config.uses_master_weights, uses_sharded_master_weights
            precision.bf16
            and self.parallel.zero_stage in (0, 1, 2)
            and topology.pipeline_model_parallel_size == 1
        )
        if precision.grad_reduce_in_bf16 and not own_reduction:
            raise ValueError(
                "--grad-reduce-in-bf16 applies to bf16 training at --zero-stage 0-2 without "
                "pipelining (mds-train's own gradient reduction); drop it"
            )
        groups, tp = self.model.num_key_value_heads, topology.tensor_model_parallel_size
        if groups is not None and groups % tp:
            raise ValueError(  # upstream's core.utils.divide asserts it in ParallelAttention
                f"--num-key-value-heads ({groups}) must be divisible by "
                f"--tensor-model-parallel-size ({tp}): each rank holds whole key/value heads"
            )
        self._validate_fp8(topology)
        self._validate_cuda_graphs(topology)
        if self.parallel.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"--zero-stage must be 0-3, got {self.parallel.zero_stage}")
        if topology.pipeline_model_parallel_size > 1 and self.parallel.zero_stage > 1:
            raise ValueError(
                "the pipeline engine supports --zero-stage 0 or 1; "
                "use --pipeline-model-parallel-size 1 for ZeRO-2/3"
            )
        if topology.pipeline_model_parallel_size > self.model.num_layers:
            raise ValueError(
                f"--pipeline-model-parallel-size ({topology.pipeline_model_parallel_size}) is "
                f"larger than --num-layers ({self.model.num_layers})"
            )
        self.profiler.check(tensorboard_dir=self.logging.tensorboard_dir)
        self.batch_schedule(topology)
        self.lr_schedule(topology)

    def _validate_cuda_graphs(self, topology: Topology) -> None:
        """--enable-cuda-graph is refused in one line where the layers cannot be graphed."""
        if self.model.enable_cuda_graph and self.model.no_cuda_graph:
            raise ValueError("give --enable-cuda-graph or --no-cuda-graph, not both")
        problem = self.cuda_graph_problem(topology)
        if self.model.enable_cuda_graph and problem is not None:
            raise ValueError(f"--enable-cuda-graph: {problem}")

    def cuda_graph_problem(self, topology: Topology) -> str | None:
        """What keeps this run's layers from being CUDA graphs, or None: what mds_model's graphs
        cannot replay, and the training paths not checked under them. Checked on a GPU: bf16 at
        ZeRO-0, 1, 2 and 3 on one data-parallel rank (mds-train's own master weights), with
        and without dropout, and ZeRO-0, 1 and 2 on two (the reduction's hooks run outside the
        graphs); FSDP2's ZeRO-3 above one rank gathers weights in hooks. DeepSpeed's ZeRO-1
        BF16 optimizer invalidated the capture, so a ZeRO-1/2/3 run whose DeepSpeed file keeps
        DeepSpeed's optimizer (offload, its own `optimizer`) runs eagerly (run.py)."""
        from mds_model.cuda_graphs import unsupported

        model = self.model.gpt_config(
            vocab_size=1,
            tensor_model_parallel_size=topology.tensor_model_parallel_size,
            params_dtype=self.params_dtype,
        )
        problem = unsupported(model, tensor_model_parallel_size=topology.tensor_model_parallel_size)
        if problem is None and topology.pipeline_model_parallel_size > 1:
            problem = (
                "the pipeline engine interleaves micro-batches: use "
                "--pipeline-model-parallel-size 1"
            )
        if problem is None and not self.precision.bf16:
            problem = "checked with --bf16 only (fp16 trains through DeepSpeed's ZeRO optimizer)"
        if problem is None and self.parallel.zero_stage == 3 and topology.data_parallel_size > 1:
            problem = (
                "ZeRO-3 above one data-parallel rank gathers each layer's weights in FSDP2's "
                "hooks, which a graph would skip: use --zero-stage 1 or 2"
            )
        if problem is None and self.precision.fp8_recipe() is not None:
            problem = (
                "FP8's first-step calibration and once-a-step weight casts are the host's "
                "decisions: drop --fp8-*"
            )
        return problem

    def uses_cuda_graphs(self, topology: Topology, *, gpu: bool) -> bool:
        """Whether the layers train as CUDA graphs: --no-cuda-graph never, --enable-cuda-graph
        always (validated), and by default on a GPU wherever nothing is in the way."""
        if self.model.no_cuda_graph:
            return False
        if self.model.enable_cuda_graph:
            return True
        return gpu and self.cuda_graph_problem(topology) is None

    def _validate_fp8(self, topology: Topology) -> None:
        """FP8 GEMMs (torch._scaled_mm) take 16-bit outputs and sizes that are multiples of 16:
        every tensor-parallel slice of a linear and the tokens of a micro-batch."""
        recipe = self.precision.fp8_recipe()
        if recipe is None:
            return
        fp8_flag = "--fp8-e4m3" if recipe.fmt == "e4m3" else "--fp8-hybrid"
        if not (self.precision.bf16 or self.precision.fp16):
            raise ValueError(f"{fp8_flag} needs --bf16 or --fp16 (the FP8 GEMMs' output dtype)")
        model, tp = self.model, topology.tensor_model_parallel_size
        ffn = GPTConfig(**model.gpt_fields(), vocab_size=1).ffn_size  # 4h, or --swiglu's rule
        sizes = {
            "--hidden-size / --tensor-model-parallel-size": model.hidden_size // tp,
            "--ffn-hidden-size / --tensor-model-parallel-size": ffn // tp,
            "--micro-batch-size x --seq-length": self.batch.micro_batch_size * model.seq_length,
        }
        for what, size in sizes.items():
            if size % 16:
                raise ValueError(f"{fp8_flag}: {what} is {size}, not a multiple of 16 (FP8 GEMMs)")

    def to_dict(self) -> dict:
        return json.loads(json.dumps(dataclasses.asdict(self), default=str))
