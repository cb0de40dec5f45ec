"""fp32 gradient accumulation and data-parallel averaging overlapped with backward, for the
master-weight optimizer (master_weights.py), as Megatron's `main_grad` buffers and torch DDP's
buckets.

Each bf16 gradient is added into its master's fp32 gradient the moment autograd produces it, and
freed. On the last micro-batch of a step, a bucket whose gradients are all in is averaged over the
data-parallel group by an asynchronous all-reduce while backward computes the earlier layers, in
place of DeepSpeed's all-reduce of every gradient after backward (DP = 2 scaled 1.84x with it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

# ~25M fp32 elements (100 MB) per bucket: torch DDP's 25 MB default for bf16 traffic is small
# for fp32 and a 345M model, and fewer, larger all-reduces keep NCCL near its bandwidth.
BUCKET_ELEMENTS = 25_000_000


def _average_async(tensor: torch.Tensor, group, size: int):
    """Starts an all-reduce that leaves the group's mean in `tensor`; returns its handle. NCCL
    averages inside the all-reduce; gloo has no AVG, so the tensor is divided first."""
    if dist.get_backend(group) == "nccl":
        op = dist.ReduceOp.AVG
    else:
        tensor.div_(size)  # a sum of averages
        op = dist.ReduceOp.SUM
    return dist.all_reduce(tensor, op=op, group=group, async_op=True)


def _hook_each(params: list[torch.nn.Parameter], accumulate: Callable[[int, torch.Tensor], None]):
    """`accumulate(index, param)` runs as each parameter's gradient is accumulated in backward."""
    for index, param in enumerate(params):
        param.register_post_accumulate_grad_hook(functools.partial(accumulate, index))


@dataclass
class _Bucket:
    flat: torch.Tensor  # fp32, the concatenated gradients of `indices`
    indices: list[int]  # positions in the reduction's parameter list
    wire: torch.Tensor | None = None  # the all-reduce's buffer when it is not `flat` (bf16)
    num_ready: int = 0
    handle: object | None = None


@dataclass
class _StepState:
    written: list[bool] = field(default_factory=list)  # gradient copied in this step (not added)
    next_bucket: int = 0  # buckets launch in index order, the same on every rank


class GradientReduction:
    """Owns the fp32 gradients of `params` (views of flat bucket buffers: `gradients`, also set
    as `master.grad` where `masters` are given) and the hooks that fill them from `params`'
    gradients. `params` come in the model's order: buckets are cut from its end, where backward
    starts.

    `is_last_micro_batch()` is asked during backward (the engine's accumulation boundary);
    `finish()` completes the step's averaging and must be called before the gradients are read.
    `reduce_dtype` bfloat16 halves the traffic (Megatron's --grad-reduce-in-bf16); the sums stay
    fp32 until then.
    """

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        masters: list[torch.Tensor] | None,
        *,
        is_last_micro_batch: Callable[[], bool],
        data_parallel_group=None,
        data_parallel_size: int = 1,
        bucket_elements: int = BUCKET_ELEMENTS,
        reduce_dtype: torch.dtype = torch.float32,
    ) -> None:
        self._params = params
        self._is_last_micro_batch = is_last_micro_batch
        self._group = data_parallel_group
        self._dp_size = data_parallel_size
        self._buckets, self._bucket_of, self.gradients = self._build_buckets(
            params, bucket_elements
        )
        if masters is not None:
            for master, gradient in zip(masters, self.gradients, strict=True):
                master.grad = gradient
        if reduce_dtype != torch.float32 and data_parallel_size > 1:
            for bucket in self._buckets:
                bucket.wire = torch.empty_like(bucket.flat, dtype=reduce_dtype)
        self._state = _StepState(written=[False] * len(params))
        _hook_each(params, self._accumulate)

    @staticmethod
    def _build_buckets(params: list[torch.nn.Parameter], bucket_elements: int):
        """Buckets in reverse parameter order: roughly the order backward produces gradients."""
        buckets, bucket_of, current, size = [], [0] * len(params), [], 0
        gradients: list[torch.Tensor] = [torch.empty(0)] * len(params)
        for index in reversed(range(len(params))):
            current.append(index)
            size += params[index].numel()
            if size >= bucket_elements or index == 0:
                flat = torch.zeros(size, dtype=torch.float32, device=params[index].device)
                offset = 0
                for i in current:
                    numel = params[i].numel()
                    gradients[i] = flat[offset : offset + numel].view(params[i].shape)
                    bucket_of[i] = len(buckets)
                    offset += numel
                buckets.append(_Bucket(flat=flat, indices=current))
                current, size = [], 0
        return buckets, bucket_of, gradients

    @torch.no_grad()
    def _accumulate(self, index: int, param: torch.Tensor) -> None:
        master_grad = self.gradients[index]
        if self._state.written[index]:
            master_grad.add_(param.grad)
        else:
            master_grad.copy_(param.grad)
            self._state.written[index] = True
        param.grad = None  # the bf16 copy is no longer needed
        if self._is_last_micro_batch():
            self._buckets[self._bucket_of[index]].num_ready += 1
            self._launch_ready()

    def _launch_ready(self) -> None:
        while self._state.next_bucket < len(self._buckets):
            bucket = self._buckets[self._state.next_bucket]
            if bucket.num_ready < len(bucket.indices):
                return
            self._launch(bucket)
            self._state.next_bucket += 1

    def _launch(self, bucket: _Bucket) -> None:
        if self._dp_size == 1:
            return
        wire = bucket.flat if bucket.wire is None else bucket.wire.copy_(bucket.flat)
        bucket.handle = _average_async(wire, self._group, self._dp_size)

    @torch.no_grad()
    def finish(self) -> None:
        """Waits for the step's averaging. A parameter that got no gradient in the step counts as
        zero; one that got none in the last micro-batch holds the earlier ones' sum."""
        for index, written in enumerate(self._state.written):
            if not written:  # its bucket cannot have been launched
                self.gradients[index].zero_()
        for bucket in self._buckets[self._state.next_bucket :]:
            bucket.num_ready = len(bucket.indices)
        self._launch_ready()
        for bucket in self._buckets:
            if bucket.handle is not None:
                bucket.handle.wait()
                if bucket.wire is not None:
                    bucket.flat.copy_(bucket.wire)
            bucket.handle, bucket.num_ready = None, 0
        self._state = _StepState(written=[False] * len(self._params))


@dataclass
class _RangeBucket:
    """Consecutive parameters of one flat group: elements [start, start + numel) of it."""

    group: int
    start: int
    numel: int
    indices: list[int]  # positions in the reduction's parameter list
    staging: torch.Tensor | None = None  # this micro-batch's gradients, while it is reduced
    num_ready: int = 0
    handle: object | None = None


class PartitionedGradientReduction:
    """ZeRO-2's gradients: each micro-batch's gradients are averaged over the data-parallel group
    in buckets as backward makes them, and each rank adds only its own partition of every bucket
    into its fp32 partition gradients (`partitions`, one per flat group, zeroed by `reset`). A
    bucket's staging buffer lives while it fills and is reduced, so no rank holds a whole
    model's gradients.

    `layout` gives, per flat group, its parameters with their offsets into the group and this
    rank's partition `(start, size)`; `model_order` is the model's parameter order (backward
    runs it in reverse). Every rank launches the buckets in one order (the reverse of each
    bucket's first parameter in the model); at the end of each backward the ones still open
    (parameters that got no gradient count as zero) are launched and all of them finished.
    """

    def __init__(
        self,
        layout: list[tuple[list[torch.nn.Parameter], list[int], tuple[int, int]]],
        model_order: list[torch.nn.Parameter],
        *,
        data_parallel_group,
        data_parallel_size: int,
        bucket_elements: int = BUCKET_ELEMENTS,
        reduce_dtype: torch.dtype = torch.float32,
    ) -> None:
        self._group, self._dp_size = data_parallel_group, data_parallel_size
        self._dtype = reduce_dtype
        position = {id(p): i for i, p in enumerate(model_order)}
        self._params: list[torch.nn.Parameter] = []
        self._where: list[tuple[int, int]] = []  # (bucket, offset in it) per parameter
        self._buckets: list[_RangeBucket] = []
        self.partitions = []
        self._partition_ranges = []
        for g, (params, offsets, (start, size)) in enumerate(layout):
            self.partitions.append(torch.zeros(size, dtype=torch.float32, device=params[0].device))
            self._partition_ranges.append((start, size))
            current: list[int] = []
            for i in reversed(range(len(params))):  # from the group's end, as backward goes
                current.append(i)
                numel = offsets[current[0]] + params[current[0]].numel() - offsets[i]
                if numel >= bucket_elements or i == 0:
                    bucket_index, indices = len(self._buckets), []
                    for j in reversed(current):  # the group's order
                        indices.append(len(self._params))
                        self._params.append(params[j])
                        self._where.append((bucket_index, offsets[j] - offsets[i]))
                    self._buckets.append(_RangeBucket(g, offsets[i], numel, indices))
                    current = []
        # launch order: the bucket whose earliest parameter comes latest in the model first
        earliest = [min(position[id(self._params[k])] for k in b.indices) for b in self._buckets]
        order = sorted(range(len(self._buckets)), key=lambda b: -earliest[b])
        rank_of = {b: r for r, b in enumerate(order)}
        self._buckets = [self._buckets[b] for b in order]
        self._where = [(rank_of[b], offset) for b, offset in self._where]
        self._next = 0
        self._pending: list[_RangeBucket] = []
        self._callback_queued = False
        _hook_each(self._params, self._accumulate)

    @torch.no_grad()
    def _accumulate(self, index: int, param: torch.Tensor) -> None:
        if not self._callback_queued:  # once per backward, as torch DDP finishes its buckets
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
            self._callback_queued = True
        b, offset = self._where[index]
        bucket = self._buckets[b]
        if bucket.staging is None:
            bucket.staging = torch.zeros(bucket.numel, dtype=self._dtype, device=param.device)
        bucket.staging.narrow(0, offset, param.numel()).copy_(param.grad.reshape(-1))
        param.grad = None
        bucket.num_ready += 1
        self._launch_ready()

    def _launch_ready(self) -> None:
        while self._next < len(self._buckets):
            bucket = self._buckets[self._next]
            if bucket.num_ready < len(bucket.indices):
                return
            if bucket.staging is None:  # no parameter of it got a gradient
                device = self.partitions[bucket.group].device
                bucket.staging = torch.zeros(bucket.numel, dtype=self._dtype, device=device)
            bucket.handle = _average_async(bucket.staging, self._group, self._dp_size)
            self._pending.append(bucket)
            self._next += 1

    @torch.no_grad()
    def _end_of_backward(self) -> None:
        for bucket in self._buckets[self._next :]:
            bucket.num_ready = len(bucket.indices)
        self._launch_ready()
        for bucket in self._pending:
            bucket.handle.wait()
            start, size = self._partition_ranges[bucket.group]
            low = max(bucket.start, start)
            high = min(bucket.start + bucket.numel, start + size)
            if low < high:
                mine = bucket.staging.narrow(0, low - bucket.start, high - low)
                self.partitions[bucket.group].narrow(0, low - start, high - low).add_(mine)
            bucket.staging, bucket.handle, bucket.num_ready = None, None, 0
        self._pending, self._next, self._callback_queued = [], 0, False

    @torch.no_grad()
    def reset(self) -> None:
        """The partitions' gradients back to zero, for the next step."""
        for partition in self.partitions:
            partition.zero_()
