"""ZeRO-1 and ZeRO-2 for bf16 runs: fp32 masters and Adam moments (and at ZeRO-2 the gradients)
sharded over the data-parallel ranks, the weights in DeepSpeed's own flat layout, one fused step
per shard, and DeepSpeed's own partition files.

DeepSpeed's BF16 optimizer (its ZeRO-1 for bf16) reached 0.94x of the compiled reference on one
H200 with the host quiet and 0.55x with it slowed, and keeps CUDA graphs out (packages/train
README, "The engines"). This optimizer does the same work the way master_weights.py does it for
ZeRO-0: each bf16 gradient is added into an fp32 gradient as backward makes it and averaged over
DP in buckets that overlap backward (grad_sync.py), one Triton launch per parameter group steps
this rank's share and writes its bf16 weights, and one all-gather per bucket brings the other
ranks' shares, during the next forward (gather_weights_during_forward).

The weights' layout is DeepSpeed's (`BF16_Optimizer._setup_for_real_optimizer`): each parameter
group's weights lie end to end in one flat bf16 buffer (the parameters become views into it),
zero-padded to a multiple of 2 x DP. Above one rank each rank steps its slice of every bucket of
that buffer (shard_layout.py, Megatron-core's cut), whose fp32 copy is the inner torch AdamW's one
parameter for the group: each bucket's gradients are averaged by one reduce-scatter as backward
makes them (grad_sync.ShardedGradientReduction; ZeRO-1 keeps the step's gradients whole until its
last micro-batch, ZeRO-2 only its slices) and its weights gathered in place by one all-gather.
`state_dict()` is what DeepSpeed's BF16 optimizer (ZeRO-1) or ZeRO optimizer (ZeRO-2) saves in
`bf16_zero_pp_rank_{dp}_mp_rank_{tp}_optim_states.pt`, cut DeepSpeed's way (rank r's r-th of DP
contiguous partitions, exchanged over the data-parallel group at save and back at load), and
`load_state_dict` takes either at the same DP, so DeepSpeed's (and upstream's) runs resume these
files and these runs resume theirs (checkpointing.py writes and finds them).
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
from mds_model.kernels import triton_available
from mds_model.kernels.master_adamw import MasterAdamWGroup

from .collectives import all_gather, gathered
from .deepspeed_engine import PartitionState, deepspeed_optimizer_state, saved_partition
from .grad_sync import BUCKET_ELEMENTS, GradientReduction, ShardedGradientReduction
from .shard_layout import Fragment, ShardLayout, Slice, shard_layout


@dataclass
class FlatGroup:
    """One parameter group laid out as DeepSpeed lays it out, and this rank's slices of it."""

    params: list[torch.nn.Parameter]
    flat: torch.Tensor  # the group's weights end to end, zero-padded; the params are views
    layout: ShardLayout
    master: torch.Tensor  # fp32 copy of this rank's slices: the inner optimizer's parameter

    @property
    def fragments(self) -> list[Fragment]:
        return self.layout.fragments

    def write_weights(self) -> None:
        """This rank's slices of the bf16 weights from the masters."""
        for piece in self.layout.slices:
            target = self.flat.narrow(0, piece.start, piece.numel)
            target.copy_(self.master.narrow(0, piece.partition_start, piece.numel))

    def read_weights(self) -> None:
        """The masters from this rank's slices of the bf16 weights."""
        for piece in self.layout.slices:
            target = self.master.narrow(0, piece.partition_start, piece.numel)
            target.copy_(self.flat.narrow(0, piece.start, piece.numel))


def flatten_group(
    params: list[torch.nn.Parameter],
    *,
    rank: int,
    size: int,
    bucket_elements: int = BUCKET_ELEMENTS,
) -> FlatGroup:
    """Moves `params` into one flat buffer (DeepSpeed's `_flatten_dense_tensors_aligned` and
    `_update_storage_to_flattened_tensor`) and takes this rank's slices' masters."""
    layout = shard_layout(
        [p.numel() for p in params], rank=rank, size=size, bucket_elements=bucket_elements
    )
    flat = torch.zeros(layout.padded_numel, dtype=params[0].dtype, device=params[0].device)
    for param, offset in zip(params, layout.offsets, strict=True):
        view = flat.narrow(0, offset, param.numel())
        view.copy_(param.data.view(-1))
        param.data = view.view(param.shape)
    master = torch.zeros(layout.partition_numel, dtype=torch.float32, device=flat.device)
    group = FlatGroup(params, flat, layout, master)
    group.read_weights()
    return group


class ShardedMasterAdamW(torch.optim.Optimizer):
    """AdamW over fp32 masters of this data-parallel rank's partition of every (bf16) parameter
    group; `param_groups` are the model's, whose `lr` the trainer's schedule sets.

    `names` maps each parameter to its name in the engine's module (DeepSpeed's
    `param_slice_mappings` key them so); `clip_grad` is recorded in the state dict as DeepSpeed
    records its own.
    """

    def __init__(
        self,
        param_groups: list[dict[str, Any]],
        *,
        betas: tuple[float, float],
        eps: float,
        names: dict[torch.nn.Parameter, str],
        data_parallel_group=None,
        data_parallel_rank: int = 0,
        data_parallel_size: int = 1,
        clip_grad: float = 0.0,
        stage: int = 1,
        use_kernel: bool | None = None,
    ) -> None:
        super().__init__(param_groups, defaults={"lr": 0.0, "weight_decay": 0.0})
        if stage not in (1, 2):
            raise ValueError(f"ShardedMasterAdamW shards ZeRO-1 or ZeRO-2, not stage {stage}")
        self.stage = stage
        self._dp_group, self._dp_size = data_parallel_group, data_parallel_size
        self._names, self.clip_grad = names, clip_grad
        self.flat_groups = [
            flatten_group(group["params"], rank=data_parallel_rank, size=data_parallel_size)
            for group in self.param_groups
        ]
        on_gpu = self.flat_groups[0].master.is_cuda
        self.use_kernel = on_gpu and triton_available() if use_kernel is None else use_kernel
        self._betas, self._eps = betas, eps
        self.inner = torch.optim.AdamW(
            [
                {"params": [flat.master], "weight_decay": group["weight_decay"], "lr": group["lr"]}
                for flat, group in zip(self.flat_groups, self.param_groups, strict=True)
            ],
            betas=betas,
            eps=eps,
            fused=on_gpu,
            foreach=None if on_gpu else True,
        )
        self._reduction: GradientReduction | None = None
        self._sharded: ShardedGradientReduction | None = None  # above one rank
        self._gradients: dict[int, torch.Tensor] | None = None  # this step's, by id(param)
        self._gradient_divisor: torch.Tensor | None = None
        self._kernel_groups: dict[tuple[int, tuple[int, ...]], MasterAdamWGroup] = {}
        # torch's AdamW (no kernel) reads the partition's gradients as one fp32 tensor
        self._partition_grads: list[torch.Tensor] | None = None
        # the weights' gather overlapping the next forward (gather_weights_during_forward)
        self._gather_order: list[tuple[int, Slice]] | None = None
        self._gathers: list = []  # its pending all-gathers, in launch order
        self._gathers_waited = 0

    # --- gradients ------------------------------------------------------------------------

    def reduce_in_backward(
        self,
        model_parameters: list[torch.nn.Parameter],
        *,
        is_last_micro_batch,
        data_parallel_group,
        data_parallel_size: int,
        reduce_dtype: torch.dtype = torch.float32,
    ) -> None:
        """From now on every gradient is added into an fp32 gradient as backward makes it and
        averaged over the data-parallel group in buckets (grad_sync.py); each rank then steps
        its own slices of the averaged gradients. ZeRO-2 keeps only those, averaged at every
        micro-batch; ZeRO-1 the whole gradients until the step's last micro-batch."""
        params = {id(p) for group in self.param_groups for p in group["params"]}
        ordered = [p for p in model_parameters if id(p) in params]
        if data_parallel_size > 1:
            self._sharded = ShardedGradientReduction(
                [(flat.params, flat.layout) for flat in self.flat_groups],
                ordered,
                accumulate_whole=self.stage == 1,
                is_last_micro_batch=is_last_micro_batch,
                data_parallel_group=data_parallel_group,
                data_parallel_size=data_parallel_size,
                reduce_dtype=reduce_dtype,
            )
            return
        reduction = GradientReduction(
            ordered,
            None,
            is_last_micro_batch=is_last_micro_batch,
            data_parallel_group=data_parallel_group,
            data_parallel_size=data_parallel_size,
            reduce_dtype=reduce_dtype,
        )
        self._reduction = reduction
        self._reduced = dict(zip(map(id, ordered), reduction.gradients, strict=True))

    @property
    def gradient_partition_group(self):
        """The group over which this rank holds only a part of the gradients (above one rank): a
        gradient norm sums its squares over it too. None: this rank holds them all."""
        return None if self._sharded is None else self._dp_group

    @torch.no_grad()
    def master_gradients(self) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
        """The gradients this step reads, each with its parameter, for clipping's norm: each
        parameter's whole gradient at one rank (the reduction's fp32 sum, else the model's own
        bf16 gradient), above one rank the pieces of this rank's slices (see
        gradient_partition_group)."""
        if self._sharded is not None:
            return [
                (flat.params[f.index], self._fragment_gradient(g, f))
                for g, flat in enumerate(self.flat_groups)
                for f in flat.fragments
            ]
        if self._gradients is None:
            if self._reduction is not None:
                self._reduction.finish()
                gradients = self._reduced
            else:
                gradients = {
                    id(p): p.grad
                    for group in self.param_groups
                    for p in group["params"]
                    if p.grad is not None
                }
            self._gradients = gradients
        return [
            (param, self._gradients[id(param)])
            for group in self.param_groups
            for param in group["params"]
            if id(param) in self._gradients
        ]

    def _fragment_gradient(self, g: int, f: Fragment) -> torch.Tensor | None:
        """This step's gradient of fragment `f` of group `g` (None: its parameter got none)."""
        if self._sharded is not None:
            return self._sharded.partitions[g].narrow(0, f.partition_start, f.numel)
        gradient = self._gradients.get(id(self.flat_groups[g].params[f.index]))
        return None if gradient is None else _piece(gradient, f)

    @torch.no_grad()
    def scale_gradients(self, coefficient: torch.Tensor) -> None:
        """Clipping's coefficient, applied as the step reads the gradients (MasterWeightAdamW's
        `scale_gradients`)."""
        if self.master_gradients():
            device = self.flat_groups[0].master.device
            self._gradient_divisor = coefficient.to(device, torch.float32).reciprocal()

    # --- the step -------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ARG002 - torch's signature
        self.finish_weight_gather()
        self.master_gradients()
        if self.use_kernel:
            self._kernel_step()
        else:
            self._torch_step()
        self._gradients, self._gradient_divisor = None, None
        if self._sharded is not None:  # the engine's zero_grad (fp32 mode) is the model's
            self._sharded.reset()
        self._gather_weights()
        return None

    def _kernel_step(self) -> None:
        """One Triton launch per group over the fragments of this partition whose parameters
        have gradients; the fragments of a group share its step count."""
        for g, (flat, group) in enumerate(zip(self.flat_groups, self.param_groups, strict=True)):
            gradients = {f: self._fragment_gradient(g, f) for f in flat.fragments}
            fragments = [f for f in flat.fragments if gradients[f] is not None]
            if not fragments:
                continue
            key = (g, tuple(f.index for f in fragments))
            kernel_group = self._kernel_groups.get(key)
            if kernel_group is None:
                state = self._adamw_state(g)
                kernel_group = MasterAdamWGroup(
                    [_piece(flat.params[f.index].data, f) for f in fragments],
                    [flat.master.narrow(0, f.partition_start, f.numel) for f in fragments],
                    [state["exp_avg"].narrow(0, f.partition_start, f.numel) for f in fragments],
                    [state["exp_avg_sq"].narrow(0, f.partition_start, f.numel) for f in fragments],
                    [state["step"]] * len(fragments),
                )
                self._kernel_groups[key] = kernel_group
            kernel_group.step(
                [gradients[f] for f in fragments],
                lr=group["lr"],
                weight_decay=group["weight_decay"],
                betas=self._betas,
                eps=self._eps,
                grad_scale=self._gradient_divisor,
            )

    def _torch_step(self) -> None:
        """torch's AdamW over each group's fp32 partition, its gradient gathered from the
        fragments (zero where a parameter got none), then the partition's bf16 weights."""
        if self._partition_grads is None:
            self._partition_grads = [torch.zeros_like(flat.master) for flat in self.flat_groups]
        sources, targets = [], []
        for g, (flat, buffer) in enumerate(
            zip(self.flat_groups, self._partition_grads, strict=True)
        ):
            buffer.zero_()
            for f in flat.fragments:
                gradient = self._fragment_gradient(g, f)
                if gradient is not None:
                    sources.append(gradient)
                    targets.append(buffer.narrow(0, f.partition_start, f.numel))
            flat.master.grad = buffer
        if targets:
            torch._foreach_copy_(targets, sources)
        for group, inner_group in zip(self.param_groups, self.inner.param_groups, strict=True):
            inner_group["lr"] = group["lr"]
        if self._gradient_divisor is not None:
            if self.inner.defaults["fused"]:
                self.inner.grad_scale = self._gradient_divisor  # read by torch's fused step
            else:
                for buffer in self._partition_grads:
                    buffer.div_(self._gradient_divisor)
        try:
            self.inner.step()
        finally:
            self.inner.__dict__.pop("grad_scale", None)
        for flat in self.flat_groups:
            flat.write_weights()

    def _adamw_state(self, g: int) -> dict[str, torch.Tensor]:
        """The inner AdamW's state of group `g`'s partition, made as torch's fused step makes it
        on first use; a step count saved on the CPU moves to the partition's device."""
        master = self.flat_groups[g].master
        state = self.inner.state[master]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=master.device)
            state["exp_avg"] = torch.zeros_like(master)
            state["exp_avg_sq"] = torch.zeros_like(master)
        elif state["step"].device != master.device or state["step"].dtype != torch.float32:
            state["step"] = state["step"].to(master.device, torch.float32)
        return state

    @torch.no_grad()
    def _gather_weights(self) -> None:
        """Every rank's updated slices into every rank's flat weights: one all-gather a bucket,
        in place; asynchronous, in the forward's order, when the next forward waits for them
        (gather_weights_during_forward), else done before the next kernel."""
        self.finish_weight_gather()
        if self._dp_size == 1:
            return
        overlapped = self._gather_order is not None
        order = self._gather_order or [
            (g, piece) for g, flat in enumerate(self.flat_groups) for piece in flat.layout.slices
        ]
        for g, piece in order:
            flat = self.flat_groups[g]
            start, numel = flat.layout.buckets[piece.bucket]
            mine = flat.flat.narrow(0, piece.start, piece.numel)
            handle = all_gather(
                flat.flat.narrow(0, start, numel), mine, self._dp_group, async_op=overlapped
            )
            if overlapped:
                self._gathers.append(handle)

    def gather_weights_during_forward(self, stages: list[torch.nn.Module]) -> None:
        """The weights' all-gather after each step runs during the next forward instead
        (Megatron-core's --overlap-param-gather): `stages` are modules the forward calls in this
        order, between them holding the model's parameters; the buckets are gathered in the
        order the stages need them, and each stage waits, before it runs, for those that hold
        its parameters and all launched before them (the last stage for all)."""
        if self._dp_size == 1:
            return
        position: dict[int, int] = {}
        for s, stage in enumerate(stages):
            for param in stage.parameters():
                position.setdefault(id(param), s)
        last = len(stages)
        buckets = []  # (first stage needing it, group, slice)
        for g, flat in enumerate(self.flat_groups):
            for piece in flat.layout.slices:
                held = flat.layout.bucket_params(piece.bucket)
                first = min(position.get(id(flat.params[i]), last) for i, *_ in held)
                buckets.append((first, g, piece))
        buckets.sort(key=lambda item: item[0])  # stable: each group's buckets in flat order
        self._gather_order = [(g, piece) for _, g, piece in buckets]
        for s, stage in enumerate(stages):
            count = len(buckets) if s == last - 1 else sum(1 for b in buckets if b[0] <= s)
            stage.register_forward_pre_hook(functools.partial(self._wait_for_gathers, count))
            # a checkpoint reads the weights whole
            stage.register_state_dict_pre_hook(lambda *_: self.finish_weight_gather())

    def _wait_for_gathers(self, count: int, *_) -> None:
        """The forward's kernels wait (on the GPU; the host goes on) for the first `count`
        all-gathers of the last step."""
        for handle in self._gathers[self._gathers_waited : count]:
            handle.wait()
        self._gathers_waited = max(self._gathers_waited, count)
        if self._gathers_waited >= len(self._gathers):
            self._gathers, self._gathers_waited = [], 0

    def finish_weight_gather(self) -> None:
        """Waits for what is left of the weights' gather: before the weights are read outside a
        forward (a checkpoint) or written (a step, a load)."""
        self._wait_for_gathers(len(self._gathers))

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none=set_to_none)
        self._gradients, self._gradient_divisor = None, None
        if self._sharded is not None:
            self._sharded.reset()

    # --- weights and state ----------------------------------------------------------------

    @torch.no_grad()
    def refresh_model_params(self) -> None:
        """The model's weights from the masters (every rank's partition)."""
        self.finish_weight_gather()
        for flat in self.flat_groups:
            flat.write_weights()
        self._gather_weights()
        self.finish_weight_gather()  # whole before anything else reads them

    @torch.no_grad()
    def refresh_fp32_params(self) -> None:
        """Masters from the model's weights (after loading weights without optimizer state)."""
        self.finish_weight_gather()
        for flat in self.flat_groups:
            flat.read_weights()

    @torch.no_grad()
    def set_parameter_state(
        self, param: torch.nn.Parameter, values: dict[str, torch.Tensor], step: int
    ) -> None:
        """This rank's piece of one parameter's fp32 master and Adam moments from whole tensors
        (a reshaped checkpoint's: `fp32`, `exp_avg`, `exp_avg_sq`) and the group's step. The
        model's weights follow at refresh_model_params."""
        self.finish_weight_gather()
        for g, flat in enumerate(self.flat_groups):
            for f in flat.fragments:
                if flat.params[f.index] is not param:
                    continue
                state = self._adamw_state(g)
                state["step"].fill_(float(step))
                targets = {"fp32": flat.master, **{k: state[k] for k in ("exp_avg", "exp_avg_sq")}}
                for key, target in targets.items():
                    piece = values[key].flatten().narrow(0, f.start, f.numel)
                    target.narrow(0, f.partition_start, f.numel).copy_(piece)
        self._kernel_groups.clear()

    def param_shapes(self) -> list[OrderedDict[str, torch.Size]]:
        """DeepSpeed's `param_shapes` (the model file's key): each group's parameters by name, in
        their order in the flat buffer."""
        return [
            OrderedDict((self._names[p], p.shape) for p in flat.params) for flat in self.flat_groups
        ]

    def state_dict(self) -> dict[str, Any]:
        """DeepSpeed's own optimizer state dict for the stage, key for key: its BF16 optimizer's
        at ZeRO-1 (the one a bf16 ZeRO-1 DeepSpeed run keeps), its ZeRO optimizer's at ZeRO-2
        (partitions without their padding, a static loss scale of 1)."""
        for g in range(len(self.flat_groups)):
            self._adamw_state(g)  # a checkpoint before the first step holds zero moments
        base = self.inner.state_dict()
        for group, model_group in zip(base["param_groups"], self.param_groups, strict=True):
            group["step"] = int(base["state"][group["params"][0]]["step"].item())  # apex reads it
            # The next step's learning rate (the trainer's schedule set it after this step) and
            # the model group's other keys (upstream's name, wd_mult, lr_mult): DeepSpeed's load
            # replaces a resuming run's groups with these, before its first step.
            group.update(
                {k: v for k, v in model_group.items() if k not in _OWN_OPTIONS + ("params",)}
            )
        base["state"] = {  # the moments cut DeepSpeed's way; the live state left alone
            index: {
                key: self._to_deepspeed(flat, value) if key in MOMENTS else value
                for key, value in base["state"][index].items()
            }
            for index, flat in enumerate(self.flat_groups)
        }
        state = PartitionState(
            base=base,
            partitions=[self._to_deepspeed(flat, flat.master) for flat in self.flat_groups],
            paddings=[flat.layout.deepspeed_padding for flat in self.flat_groups],
            dp_size=self._dp_size,
            fragments=[
                [
                    (self._names[flat.params[f.index]], f.numel, f.partition_start)
                    for f in flat.layout.deepspeed_fragments
                ]
                for flat in self.flat_groups
            ],
            param_counts=[len(flat.params) for flat in self.flat_groups],
        )
        return deepspeed_optimizer_state(state, stage=self.stage, clip_grad=self.clip_grad)

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """A DeepSpeed ZeRO-1/2 or BF16 optimizer's state dict for this rank, saved at this DP
        over the same parameter groups (ValueError, one line, otherwise); then the model's
        weights from its masters."""
        self.finish_weight_gather()
        found = saved_partition(state_dict)
        counts, saved, base = found.partition_counts, found.partitions, found.base
        if any(count != self._dp_size for count in counts):
            raise ValueError(
                f"its optimizer partitions were saved by {counts[0]} data-parallel ranks, this "
                f"run has {self._dp_size}"
            )
        if len(saved) != len(self.flat_groups):
            raise ValueError(
                f"its optimizer has {len(saved)} parameter groups, this run's has "
                f"{len(self.flat_groups)}"
            )
        if not isinstance(base, dict):  # DeepSpeed's elastic layout: a list of group states
            raise ValueError(
                "its optimizer state was saved with DeepSpeed's elastic_checkpoint; reshape it "
                "with mds-merge-mp --with-optimizer"
            )
        for flat, partition in zip(self.flat_groups, saved, strict=True):
            # ZeRO-1/2 save partitions without their padding, the BF16 optimizer with it
            size, padding = flat.layout.partition_numel, flat.layout.deepspeed_padding
            if partition.numel() not in (size, size - padding):
                raise ValueError(
                    f"its optimizer partition holds {partition.numel()} values, this run's "
                    f"{size}: the parameter groups differ"
                )
            flat.master.copy_(self._from_deepspeed(flat, partition))
        base = {
            "param_groups": base["param_groups"],
            "state": {
                index: {
                    key: self._from_deepspeed(self.flat_groups[index], value)
                    if key in MOMENTS
                    else value
                    for key, value in state.items()
                }
                for index, state in base["state"].items()
            },
        }
        own = [{key: group[key] for key in _OWN_OPTIONS} for group in self.inner.param_groups]
        self.inner.load_state_dict(_with_steps(base))
        for group, options in zip(self.inner.param_groups, own, strict=True):
            group.update(options)  # how this run steps, whatever the saving run did
        self._kernel_groups.clear()
        self.refresh_model_params()

    # --- DeepSpeed's cut (its files) and ours ----------------------------------------------

    def _to_deepspeed(self, flat: FlatGroup, mine: torch.Tensor) -> torch.Tensor:
        """This rank's DeepSpeed partition of a tensor laid out as the masters (this rank's
        slices end to end): each bucket gathered in turn, what falls in the partition kept.
        Collective over the data-parallel group. One rank: `mine` itself (a copy of the masters
        and moments would double their memory while the checkpoint is written)."""
        layout = flat.layout
        if self._dp_size == 1:
            return mine
        mine = mine.to(flat.master.device, torch.float32)
        out = torch.zeros_like(flat.master)
        begin = layout.deepspeed_start
        for piece in layout.slices:
            start, numel = layout.buckets[piece.bucket]
            whole = gathered(
                mine.narrow(0, piece.partition_start, piece.numel), self._dp_group, self._dp_size
            )
            low, high = max(start, begin), min(start + numel, begin + out.numel())
            if low < high:
                out.narrow(0, low - begin, high - low).copy_(
                    whole.narrow(0, low - start, high - low)
                )
        return out

    def _from_deepspeed(self, flat: FlatGroup, partition: torch.Tensor) -> torch.Tensor:
        """A tensor laid out as the masters from this rank's DeepSpeed partition of it (zero past
        a partition saved without its padding): every rank's partition gathered a chunk at a
        time, what falls in this rank's slices kept. Collective over the data-parallel group."""
        layout = flat.layout
        size = layout.partition_numel
        padded = torch.zeros_like(flat.master)
        padded.narrow(0, 0, partition.numel()).copy_(partition)
        if self._dp_size == 1:
            return padded
        out = torch.zeros_like(flat.master)
        chunk = max(numel for _, numel in layout.buckets) // self._dp_size
        for offset in range(0, size, chunk):
            count = min(chunk, size - offset)
            pieces = gathered(padded.narrow(0, offset, count), self._dp_group, self._dp_size)
            for rank in range(self._dp_size):
                begin = rank * size + offset  # where rank's piece lies in the flat group
                for piece in layout.slices_overlapping(begin, count):
                    low = max(begin, piece.start)
                    high = min(begin + count, piece.start + piece.numel)
                    source = pieces.narrow(0, rank * count + low - begin, high - low)
                    at = piece.partition_start + low - piece.start
                    out.narrow(0, at, high - low).copy_(source)
        return out


# The Adam moments, laid out as the masters.
MOMENTS = ("exp_avg", "exp_avg_sq")
# The inner AdamW's implementation choices, kept over a loaded state dict's.
_OWN_OPTIONS = ("fused", "foreach", "capturable", "differentiable")


def _piece(tensor: torch.Tensor, fragment: Fragment) -> torch.Tensor:
    return tensor.reshape(-1).narrow(0, fragment.start, fragment.numel)


def _with_steps(base: dict[str, Any]) -> dict[str, Any]:
    """A torch optimizer state dict whose every state has its `step` (apex's and DeepSpeed's
    fused Adams keep it in the param group instead), padded moments unchanged."""
    states = {}
    for group in base["param_groups"]:
        for index in group["params"]:
            state = dict(base["state"].get(index, {}))
            if state and "step" not in state:
                state["step"] = torch.tensor(float(group.get("step", 0)))
            states[index] = state
    return {"state": states, "param_groups": base["param_groups"]}
