"""ZeRO-3 of bf16 runs: torch's FSDP2 (`fully_shard`) over the data-parallel group, with the
files DeepSpeed's stage 3 writes.

Each transformer layer is one FSDP2 unit and the rest of the model (embeddings, final norm, head)
the root's: a unit's weights are all-gathered in bf16 just before its forward (the next one's
prefetched while it runs), freed after it, gathered again for its backward, and its gradients
reduce-scattered in fp32 as soon as they exist, overlapping the layers still computing. The
sharded parameters are fp32 and are the masters: FSDP2 casts them to bf16 as it gathers, and
`FullyShardedAdamW` steps each rank's rows with torch's fused AdamW. Chosen over DeepSpeed's
stage 3, whose per-parameter hooks, partition bookkeeping and host-side work ran 345M at 0.38x
the compiled reference on one GPU (benchmarks/results/).

The two shard differently: FSDP2 gives each rank whole rows of each parameter (torch.chunk's
split of dim 0), DeepSpeed's stage 3 `ceil(numel / DP)` values of each flattened parameter, its
partitions laid end to end in sub-groups of `sub_group_size` values. Files are DeepSpeed's: the
state is gathered one parameter at a time and cut DeepSpeed's way on save, and back on load.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

import torch
import torch.distributed as dist

from .deepspeed_engine import Zero3State, saved_zero3_state, zero3_optimizer_state

# DeepSpeed's default `zero_optimization.sub_group_size` (elements per flat sub-group).
DEFAULT_SUB_GROUP_SIZE = 1_000_000_000
MOMENTS = ("exp_avg", "exp_avg_sq")


def data_parallel_mesh(dp_group, device_type: str):
    """The one-dimensional device mesh over the data-parallel group FSDP2 shards over."""
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh.from_group(dp_group, device_type, mesh_dim_names=("dp",))


def shard_model(module: torch.nn.Module, layers: torch.nn.ModuleList, mesh, *, compute_dtype):
    """Shards `module` in place: each of `layers` one unit, the rest the root's; the parameters
    become fp32 DTensors (their attributes, such as `tensor_model_parallel`, kept)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    attributes = {name: dict(vars(param)) for name, param in module.named_parameters()}
    for param in module.parameters():
        param.data = param.data.float()  # the masters: the bf16 weights' exact values
    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(module, mesh=mesh, mp_policy=policy)
    for name, param in module.named_parameters():
        for key, value in attributes[name].items():
            setattr(param, key, value)


def zero3_module_placeholders(module: torch.nn.Module) -> dict[str, Any]:
    """The `module` DeepSpeed's stage 3 saves: the module's state dict with each partitioned
    parameter an empty bf16 tensor (the weights are in the partition files)."""

    def empty(value: Any) -> Any:
        if isinstance(value, dict):
            return type(value)((key, empty(item)) for key, item in value.items())
        return torch.empty(0, dtype=torch.bfloat16) if torch.is_tensor(value) else value

    return empty(module.state_dict())


def _local(param: torch.Tensor) -> torch.Tensor:
    return param._local_tensor if hasattr(param, "_local_tensor") else param


class FullyShardedAdamW(torch.optim.Optimizer):
    """AdamW over this rank's rows of FSDP2's fp32 sharded parameters; `param_groups` are the
    model's, whose `lr` the trainer's schedule sets. `names` maps each parameter to its name in
    the engine's module (DeepSpeed's `param_shapes` key them so)."""

    stage = 3

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
        sub_group_size: int = DEFAULT_SUB_GROUP_SIZE,
    ) -> None:
        super().__init__(param_groups, defaults={"lr": 0.0, "weight_decay": 0.0})
        self._betas, self._eps, self._names = betas, eps, names
        self._dp_group, self._dp_rank, self._dp_size = (
            data_parallel_group,
            data_parallel_rank,
            data_parallel_size,
        )
        self.sub_group_size = sub_group_size or DEFAULT_SUB_GROUP_SIZE
        self._fused = _local(self.param_groups[0]["params"][0]).is_cuda
        self._scale: torch.Tensor | None = None
        self._step = 0

    def bind(self, module: torch.nn.Module) -> None:
        """The parameters `shard_model` put in place of the ones this optimizer was built over,
        matched by name."""
        sharded = dict(module.named_parameters())
        for group in self.param_groups:
            group["params"] = [sharded[self._names[param]] for param in group["params"]]
        self._names = {param: name for name, param in sharded.items()}
        self._fused = _local(self.param_groups[0]["params"][0]).is_cuda

    # --- gradients ------------------------------------------------------------------------

    @property
    def gradient_partition_group(self):
        """Each rank holds its rows' gradients only: a norm sums its squares over DP too."""
        return self._dp_group if self._dp_size > 1 else None

    def master_gradients(self) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
        """This rank's rows of each gradient (fp32, averaged over DP by FSDP2), with their
        parameter, for clipping's norm."""
        return [
            (param, _local(param.grad))
            for group in self.param_groups
            for param in group["params"]
            if param.grad is not None and _local(param).numel()
        ]

    def scale_gradients(self, coefficient: torch.Tensor) -> None:
        """Clipping's coefficient, applied as the step reads the gradients."""
        self._scale = coefficient

    # --- the step -------------------------------------------------------------------------

    def _state_of(self, param: torch.nn.Parameter) -> dict[str, torch.Tensor]:
        state = self.state[param]
        if not state:
            local = _local(param)
            state.update({key: torch.zeros_like(local) for key in MOMENTS})
            device = local.device if self._fused else torch.device("cpu")
            state["step"] = torch.tensor(float(self._step), dtype=torch.float32, device=device)
        return state

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ARG002 - torch's signature
        from torch.optim.adamw import adamw

        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None and _local(p).numel()]
            if not params:
                continue
            grads = [_local(p.grad) for p in params]
            if self._scale is not None:
                torch._foreach_mul_(grads, self._scale.to(grads[0].device, torch.float32))
            states = [self._state_of(p) for p in params]
            adamw(
                [_local(p) for p in params],
                grads,
                [s["exp_avg"] for s in states],
                [s["exp_avg_sq"] for s in states],
                [],
                [s["step"] for s in states],
                foreach=None if self._fused else True,
                fused=self._fused or None,
                amsgrad=False,
                beta1=self._betas[0],
                beta2=self._betas[1],
                lr=group["lr"],
                weight_decay=group["weight_decay"],
                eps=self._eps,
                maximize=False,
            )
        self._step += 1
        self._scale = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none=set_to_none)
        self._scale = None

    # what the trainer calls on every optimizer that keeps masters: here they are the weights
    def refresh_model_params(self) -> None:
        pass

    def refresh_fp32_params(self) -> None:
        pass

    # --- DeepSpeed's stage-3 layout -------------------------------------------------------

    def _partition_numel(self, param: torch.nn.Parameter) -> int:
        return math.ceil(param.numel() / self._dp_size)

    def _sub_groups(self) -> list[tuple[int, list[torch.nn.Parameter]]]:
        """(group index, parameters) of each of DeepSpeed's flat sub-groups
        (`_create_fp16_sub_groups`): parameters in order until one takes the sub-group to
        `sub_group_size` partition values or more."""
        out = []
        for g, group in enumerate(self.param_groups):
            params = group["params"]
            if self.sub_group_size >= sum(map(self._partition_numel, params)):
                out.append((g, list(params)))
                continue
            current, size = [], 0
            for param in params:
                current.append(param)
                size += self._partition_numel(param)
                if size >= self.sub_group_size or param is params[-1]:
                    out.append((g, current))
                    current, size = [], 0
        return out

    def _rows(self, param: torch.nn.Parameter) -> tuple[int, int]:
        """This rank's first row and row count of `param` (FSDP2's torch.chunk split)."""
        rows = param.shape[0]
        chunk = math.ceil(rows / self._dp_size)
        start = min(self._dp_rank * chunk, rows)
        return start, min(start + chunk, rows) - start

    def _whole(self, param: torch.nn.Parameter, local: torch.Tensor) -> torch.Tensor:
        """The whole tensor of which `local` is this rank's rows (collective over DP)."""
        if self._dp_size == 1:
            return local
        chunk = math.ceil(param.shape[0] / self._dp_size)
        padded = torch.zeros((chunk, *param.shape[1:]), dtype=local.dtype, device=local.device)
        padded[: local.shape[0]].copy_(local)
        gathered = _all_gather(padded, self._dp_group, self._dp_size)
        return gathered[: param.shape[0]]

    def _deepspeed_partition(self, param: torch.nn.Parameter, whole: torch.Tensor) -> torch.Tensor:
        size = self._partition_numel(param)
        flat = whole.reshape(-1)
        padded = torch.zeros(size * self._dp_size, dtype=flat.dtype, device=flat.device)
        padded[: flat.numel()].copy_(flat)
        return padded.narrow(0, self._dp_rank * size, size)

    def _from_deepspeed_partition(
        self, param: torch.nn.Parameter, partition: torch.Tensor
    ) -> torch.Tensor:
        """This rank's rows of `param` from every rank's DeepSpeed partition of it (collective:
        this rank gives its own)."""
        local = _local(param)
        partition = partition.to(local.device, torch.float32)
        whole = (
            _all_gather(partition, self._dp_group, self._dp_size)
            if self._dp_size > 1
            else partition
        )
        start, count = self._rows(param)
        rows = whole[: param.numel()].view(param.shape)
        return rows.narrow(0, start, count)

    def param_shapes(self) -> list[OrderedDict[str, torch.Size]]:
        """DeepSpeed's `param_shapes`: each sub-group's parameters by name, in their order in
        its flat partitions."""
        return [
            OrderedDict((self._names[p], p.shape) for p in params)
            for _, params in self._sub_groups()
        ]

    @torch.no_grad()
    def state_dict(self) -> dict[str, Any]:
        """DeepSpeed's stage-3 optimizer state dict for this rank (`_rigid_state_dict`), key for
        key; collective over the data-parallel group."""
        flats: dict[str, list[torch.Tensor]] = {"fp32": [], **{key: [] for key in MOMENTS}}
        steps = []
        for _, params in self._sub_groups():
            pieces: dict[str, list[torch.Tensor]] = {key: [] for key in flats}
            for param in params:
                state = self._state_of(param) if _local(param).numel() else {}
                for key in flats:
                    local = _local(param) if key == "fp32" else state.get(key, _local(param))
                    whole = self._whole(param, local.float())
                    pieces[key].append(self._deepspeed_partition(param, whole).cpu())
            for key in flats:
                flats[key].append(torch.cat(pieces[key]))
            steps.append(self._step)
        return zero3_optimizer_state(
            Zero3State(
                groups=[
                    {k: v for k, v in group.items() if k != "params"} for group in self.param_groups
                ],
                sub_group_of=[g for g, _ in self._sub_groups()],
                fp32=flats["fp32"],
                exp_avg=flats["exp_avg"],
                exp_avg_sq=flats["exp_avg_sq"],
                steps=steps,
                dp_size=self._dp_size,
            ),
            betas=self._betas,
            eps=self._eps,
        )

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict[str, Any], *, weights_only: bool = False) -> None:
        """A DeepSpeed stage-3 optimizer state dict for this rank, saved at this DP over the same
        parameters (ValueError, one line, otherwise): the weights, and unless `weights_only` the
        moments and step; collective over the data-parallel group."""
        saved = saved_zero3_state(state_dict)
        if saved.dp_size != self._dp_size:
            raise ValueError(
                f"its ZeRO-3 partitions were saved by {saved.dp_size} data-parallel ranks, this "
                f"run has {self._dp_size}"
            )
        sub_groups = self._sub_groups()
        sizes = [sum(map(self._partition_numel, params)) for _, params in sub_groups]
        found = [flat.numel() for flat in saved.fp32]
        if found != sizes:
            raise ValueError(
                f"its ZeRO-3 sub-groups hold {found} values, this run's {sizes}: the parameters "
                "or the sub_group_size differ"
            )
        keys = ("fp32",) if weights_only else ("fp32", *MOMENTS)
        for s, (_, params) in enumerate(sub_groups):
            offset = 0
            for param in params:
                size = self._partition_numel(param)
                for key in keys:
                    partition = getattr(saved, key)[s].narrow(0, offset, size)
                    rows = self._from_deepspeed_partition(param, partition)
                    if not _local(param).numel():
                        continue
                    target = _local(param) if key == "fp32" else self._state_of(param)[key]
                    target.copy_(rows)
                offset += size
        if not weights_only:
            self._step = saved.steps[0] if saved.steps else 0
            for state in self.state.values():
                state["step"].fill_(float(self._step))

    @torch.no_grad()
    def set_parameter_state(
        self, param: torch.nn.Parameter, values: dict[str, torch.Tensor], step: int | None
    ) -> None:
        """This rank's rows of one parameter's fp32 weights (and, given, Adam moments) from whole
        tensors (a reshaped checkpoint's `fp32`, `exp_avg`, `exp_avg_sq`), and the step."""
        start, count = self._rows(param)
        if not count:
            return
        for key, whole in values.items():
            rows = whole.reshape(param.shape).narrow(0, start, count)
            target = _local(param) if key == "fp32" else self._state_of(param)[key]
            target.copy_(rows.to(target.device, torch.float32))
        if step is not None:
            self._step = step
            for state in self.state.values():
                state["step"].fill_(float(step))


def _all_gather(tensor: torch.Tensor, group, size: int) -> torch.Tensor:
    """Every rank's equal-shaped `tensor`, concatenated along dim 0."""
    out = torch.empty((size * tensor.shape[0], *tensor.shape[1:]), dtype=tensor.dtype,
                      device=tensor.device)  # fmt: skip
    if dist.get_backend(group) == "nccl":
        dist.all_gather_into_tensor(out, tensor.contiguous(), group=group)
    else:  # gloo gathers into a list
        dist.all_gather(list(out.chunk(size)), tensor.contiguous(), group=group)
    return out
