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

from .collectives import reduce_scatter_average
from .shard_layout import ShardLayout, Slice

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
class _ShardedBucket:
    """Elements [start, start + numel) of one flat group; this rank keeps `mine` of them."""

    group: int
    start: int
    numel: int
    mine: Slice
    pieces: list[tuple[int, int, int, int]]  # (parameter, start in it, elements, start here)
    buffer: torch.Tensor | None = None  # its gradients (ZeRO-1: the step's micro-batches summed)
    wire: torch.Tensor | None = None  # what is being reduced: `buffer`, or a bf16 copy of it
    num_ready: int = 0
    handle: object | None = None
    into_partition: bool = False  # reduced straight into the partition
    partition_written: bool = False  # the partition holds this step's reduction already


class ShardedGradientReduction:
    """ZeRO-1/2 gradients above one data-parallel rank, over the buckets of each flat group's
    ShardLayout: a bucket's gradients are averaged over the group by one reduce-scatter as soon
    as backward has made them all, and each rank keeps its slice in its fp32 partition gradients
    (`partitions`, one per flat group, its slices end to end).

    ZeRO-1 (`accumulate_whole`) sums the step's micro-batches into whole fp32 buckets and reduces
    on the last one (`is_last_micro_batch()`, asked during backward); ZeRO-2 reduces every
    micro-batch's gradients from a buffer that lives while the bucket fills and is reduced, and
    adds its slice, so no rank holds a whole model's gradients. Every rank launches the buckets in
    one order (the reverse of each bucket's first parameter in `model_order`); at the end of a
    backward that reduces, the buckets still open (parameters that got no gradient count as
    zero) are launched and all of them finished. Reduced in `reduce_dtype` (bf16:
    --grad-reduce-in-bf16), summed in fp32.
    """

    def __init__(
        self,
        groups: list[tuple[list[torch.nn.Parameter], ShardLayout]],
        model_order: list[torch.nn.Parameter],
        *,
        accumulate_whole: bool,
        is_last_micro_batch: Callable[[], bool],
        data_parallel_group,
        data_parallel_size: int,
        reduce_dtype: torch.dtype = torch.float32,
    ) -> None:
        self._group, self._dp_size = data_parallel_group, data_parallel_size
        self._whole, self._is_last = accumulate_whole, is_last_micro_batch
        self._dtype = reduce_dtype
        position = {id(p): i for i, p in enumerate(model_order)}
        self._params: list[torch.nn.Parameter] = []
        # per parameter: (bucket, start in the parameter, elements, start in the bucket)
        self._pieces: list[list[tuple[int, int, int, int]]] = []
        self.partitions: list[torch.Tensor] = []
        buckets: list[_ShardedBucket] = []
        first_of: dict[int, int] = {}
        for g, (params, layout) in enumerate(groups):
            device = params[0].device
            self.partitions.append(torch.zeros(layout.partition_numel, device=device))
            index_of = []
            for param in params:
                index_of.append(len(self._params))
                self._params.append(param)
                self._pieces.append([])
            for b, ((start, numel), mine) in enumerate(
                zip(layout.buckets, layout.slices, strict=True)
            ):
                held = layout.bucket_params(b)
                pieces = [(index_of[i], *rest) for i, *rest in held]
                first_of[len(buckets)] = min(position[id(params[i])] for i, *_ in held)
                buckets.append(_ShardedBucket(g, start, numel, mine, pieces))
        order = sorted(range(len(buckets)), key=lambda b: -first_of[b])
        self._buckets = [buckets[b] for b in order]
        for b, bucket in enumerate(self._buckets):
            for param, start, numel, at in bucket.pieces:
                self._pieces[param].append((b, start, numel, at))
        self._written = [False] * len(self._params)  # ZeRO-1: copied into its buckets this step
        self._next = 0
        self._pending: list[_ShardedBucket] = []
        self._callback_queued = False
        _hook_each(self._params, self._accumulate)

    def _reducing(self) -> bool:
        return not self._whole or self._is_last()

    def _buffer(self, bucket: _ShardedBucket, device) -> torch.Tensor:
        """The bucket's gradient buffer: ZeRO-1's made once, zeroed; ZeRO-2's at each
        micro-batch, where only the padding past its parameters is zeroed (the parameters'
        pieces are written, or zeroed by `finish` where a parameter got no gradient)."""
        if bucket.buffer is None:
            if self._whole:
                bucket.buffer = torch.zeros(bucket.numel, dtype=torch.float32, device=device)
            else:
                bucket.buffer = torch.empty(bucket.numel, dtype=self._dtype, device=device)
                covered = max(at + numel for _, _, numel, at in bucket.pieces)
                bucket.buffer.narrow(0, covered, bucket.numel - covered).zero_()
        return bucket.buffer

    @torch.no_grad()
    def _accumulate(self, index: int, param: torch.Tensor) -> None:
        if not self._callback_queued:  # once per backward, as torch DDP finishes its buckets
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
            self._callback_queued = True
        gradient = param.grad.reshape(-1)
        add = self._whole and self._written[index]
        for b, start, numel, at in self._pieces[index]:
            target = self._buffer(self._buckets[b], param.device).narrow(0, at, numel)
            piece = gradient.narrow(0, start, numel)
            target.add_(piece) if add else target.copy_(piece)
        self._written[index] = True
        param.grad = None  # the bf16 gradient is no longer needed
        if self._reducing():
            for b, *_ in self._pieces[index]:
                self._buckets[b].num_ready += 1
            self._launch_ready()

    def _launch_ready(self) -> None:
        while self._next < len(self._buckets):
            bucket = self._buckets[self._next]
            if bucket.num_ready < len(bucket.pieces):
                return
            self._launch(bucket)
            self._pending.append(bucket)
            self._next += 1

    def _launch(self, bucket: _ShardedBucket) -> None:
        """One reduce-scatter: straight into the partition on the step's first reduction, else
        into the wire's own slice, added to the partition once it is done."""
        wire = self._buffer(bucket, self.partitions[bucket.group].device)
        bucket.wire = wire if wire.dtype == self._dtype else wire.to(self._dtype)
        target = self._partition_slice(bucket)
        bucket.into_partition = not bucket.partition_written and bucket.wire.dtype == target.dtype
        output = target if bucket.into_partition else self._wire_slice(bucket)
        bucket.handle = reduce_scatter_average(output, bucket.wire, self._group, async_op=True)

    def _partition_slice(self, bucket: _ShardedBucket) -> torch.Tensor:
        mine = bucket.mine
        return self.partitions[bucket.group].narrow(0, mine.partition_start, mine.numel)

    def _wire_slice(self, bucket: _ShardedBucket) -> torch.Tensor:
        return bucket.wire.narrow(0, bucket.mine.start - bucket.start, bucket.mine.numel)

    @torch.no_grad()
    def _end_of_backward(self) -> None:
        self._callback_queued = False
        if self._reducing():
            self.finish()

    @torch.no_grad()
    def finish(self) -> None:
        """Launches what is left of the reduction and waits for all of it."""
        device = self.partitions[0].device
        for index, written in enumerate(self._written):
            if not written:  # no gradient: zero, not an earlier step's or the buffer's last
                for b, _, numel, at in self._pieces[index]:
                    self._buffer(self._buckets[b], device).narrow(0, at, numel).zero_()
        for bucket in self._buckets[self._next :]:
            bucket.num_ready = len(bucket.pieces)
        self._launch_ready()
        for bucket in self._pending:
            bucket.handle.wait()
            if not bucket.into_partition:
                target, reduced = self._partition_slice(bucket), self._wire_slice(bucket)
                target.add_(reduced) if bucket.partition_written else target.copy_(reduced)
            bucket.partition_written = True
            if not self._whole:
                bucket.buffer = None
            bucket.handle, bucket.wire, bucket.num_ready = None, None, 0
            bucket.into_partition = False
        self._pending, self._next = [], 0
        self._written = [False] * len(self._params)

    @torch.no_grad()
    def reset(self) -> None:
        """The next reduction starts the next step's gradients."""
        for bucket in self._buckets:
            bucket.partition_written = False
