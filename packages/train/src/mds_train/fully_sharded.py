"""mds-train's bf16 ZeRO-3, with the files DeepSpeed's stage 3 writes.

Above one data-parallel rank, torch's FSDP2 (`fully_shard`) over the data-parallel group: each
transformer layer is one unit and the rest of the model (embeddings, final norm, head) the
root's; a unit's weights are all-gathered in bf16 just before its forward (the next one's
prefetched while it runs), freed after it, gathered again for its backward, and its gradients
reduce-scattered in fp32 as soon as they exist, overlapping the layers still computing. The
sharded parameters are fp32 and are the masters: FSDP2 casts them to bf16 as it gathers, and
`FullyShardedAdamW` steps each rank's rows with torch's fused AdamW. At one rank nothing is
sharded and FSDP2's one-rank path copies every parameter in Python before each layer, so
`SingleRankZero3AdamW` runs the ZeRO-0 step instead (torchtitan likewise applies FSDP2 only
above one rank). Both replace DeepSpeed's stage 3, whose per-parameter hooks and host-side work
ran 345M at 0.24-0.38x the compiled reference on one GPU (benchmarks/results/).

The two shard differently: FSDP2 gives each rank whole rows of each parameter (torch.chunk's
split of dim 0), DeepSpeed's stage 3 `ceil(numel / DP)` values of each flattened parameter, its
partitions laid end to end in sub-groups of `sub_group_size` values. Files are DeepSpeed's
(`DeepSpeedZero3Files`): the state is gathered one parameter at a time and cut DeepSpeed's way
on save, and back on load. They hold upstream's one parameter group (`UPSTREAM_ZERO3_GROUP`), so
upstream's ZeRO-3 resumes them; the optimizer keeps Megatron's two (2-D weights decayed).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

import torch

from .collectives import gathered
from .deepspeed_engine import Zero3State, saved_zero3_state, zero3_optimizer_state
from .master_weights import MasterWeightAdamW
from .param_groups import UPSTREAM_ZERO3_GROUP

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


class DeepSpeedZero3Files:
    """DeepSpeed's stage-3 optimizer files (`state_dict`, `load_state_dict`, `param_shapes`) of
    an optimizer that gives each parameter's whole fp32 master and moments (`whole_state`) and
    takes them back (`set_parameter_state`); the data-parallel layout is DeepSpeed's: each
    parameter's `ceil(numel / DP)` values from `rank * ceil(numel / DP)` of its flattened,
    zero-padded tensor, laid end to end in sub-groups (`_create_fp16_sub_groups`) of the files'
    parameter groups: written as upstream's one, every parameter in module order
    (`UPSTREAM_ZERO3_GROUP`); read as that or, in the files of DeepSpeed's own stage 3 (mds-train's
    offload, fp16 and fp32 runs) and mds-train's before these, as the optimizer's groups."""

    stage = 3

    def _zero3_init(self, *, names, dp_group, dp_rank: int, dp_size: int, sub_group_size: int):
        self._names = names
        self._dp_group, self.dp_rank, self.dp_size = dp_group, dp_rank, dp_size
        self.sub_group_size = sub_group_size or DEFAULT_SUB_GROUP_SIZE

    def whole_state(self, param: torch.nn.Parameter) -> tuple[dict[str, torch.Tensor], int]:
        """{fp32, exp_avg, exp_avg_sq: whole fp32 tensor} of `param` and its step (collective
        over DP where the state is sharded)."""
        raise NotImplementedError

    def set_parameter_state(self, param, values: dict[str, torch.Tensor], step: int | None):
        raise NotImplementedError

    def _partition_numel(self, param: torch.nn.Parameter) -> int:
        return math.ceil(param.numel() / self.dp_size)

    def _file_groups(self, count: int) -> list[list[torch.nn.Parameter]]:
        """The parameters of each of the files' `count` groups: upstream's one in module order
        (the order of `names`, which come from the module's named_parameters), or this
        optimizer's own groups."""
        if count != 1:
            return [list(group["params"]) for group in self.param_groups]
        mine = {param for group in self.param_groups for param in group["params"]}
        return [[param for param in self._names if param in mine]]

    def _sub_groups(self, count: int = 1) -> list[tuple[int, list[torch.nn.Parameter]]]:
        """(group index, parameters) of each of DeepSpeed's flat sub-groups of the files' `count`
        groups: parameters in order until one takes the sub-group to `sub_group_size` partition
        values or more."""
        out = []
        for g, params in enumerate(self._file_groups(count)):
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

    def param_shapes(self) -> list[OrderedDict[str, torch.Size]]:
        """DeepSpeed's `param_shapes`: each sub-group's parameters by name, in their order in
        its flat partitions."""
        return [
            OrderedDict((self._names[p], p.shape) for p in params)
            for _, params in self._sub_groups()
        ]

    def _deepspeed_partition(self, param: torch.nn.Parameter, whole: torch.Tensor) -> torch.Tensor:
        size = self._partition_numel(param)
        flat = whole.reshape(-1)
        padded = torch.zeros(size * self.dp_size, dtype=torch.float32, device=flat.device)
        padded[: flat.numel()].copy_(flat)
        return padded.narrow(0, self.dp_rank * size, size)

    @torch.no_grad()
    def state_dict(self) -> dict[str, Any]:
        """DeepSpeed's stage-3 optimizer state dict for this rank (`_rigid_state_dict`), key for
        key; collective over the data-parallel group where the state is sharded."""
        keys = ("fp32", *MOMENTS)
        flats: dict[str, list[torch.Tensor]] = {key: [] for key in keys}
        steps, sub_group_of = [], []
        for g, params in self._sub_groups():
            pieces: dict[str, list[torch.Tensor]] = {key: [] for key in keys}
            step = 0
            for param in params:
                values, step = self.whole_state(param)
                for key in keys:
                    pieces[key].append(self._deepspeed_partition(param, values[key]).cpu())
            for key in keys:
                flats[key].append(torch.cat(pieces[key]))
            steps.append(step)
            sub_group_of.append(g)
        # the learning rate and the inner AdamW's options are every group's alike
        options = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        state = Zero3State(
            groups=[{**options, **UPSTREAM_ZERO3_GROUP}],
            sub_group_of=sub_group_of,
            fp32=flats["fp32"],
            exp_avg=flats["exp_avg"],
            exp_avg_sq=flats["exp_avg_sq"],
            steps=steps,
            dp_size=self.dp_size,
        )
        return zero3_optimizer_state(state, betas=self._betas, eps=self._eps)

    @torch.no_grad()
    def load_state_dict(
        self,
        state_dict: dict[str, Any],
        *,
        weights_only: bool = False,
        param_shapes: list[dict[str, Any]] | None = None,
    ) -> None:
        """A DeepSpeed stage-3 optimizer state dict for this rank, saved at this DP over the same
        parameters (ValueError, one line, otherwise): the weights, and unless `weights_only` the
        moments and step; collective over the data-parallel group where the state is sharded.
        `param_shapes`, the model file's, must name this run's parameters in the partitions'
        order: the partitions' sizes alone do not tell the order."""
        saved = saved_zero3_state(state_dict)
        if saved.dp_size != self.dp_size:
            raise ValueError(
                f"its ZeRO-3 partitions were saved by {saved.dp_size} data-parallel ranks, this "
                f"run has {self.dp_size}"
            )
        sub_groups = self._sub_groups(saved.group_count)
        sizes = [sum(map(self._partition_numel, params)) for _, params in sub_groups]
        found = [flat.numel() for flat in saved.fp32]
        if found != sizes:
            raise ValueError(
                f"its ZeRO-3 sub-groups hold {found} values, this run's {sizes}: the parameters "
                "or the sub_group_size differ"
            )
        if param_shapes is not None:
            saved_names = [name for shapes in param_shapes for name in shapes]
            _check_names(saved_names, [self._names[p] for _, ps in sub_groups for p in ps])
        keys = ("fp32",) if weights_only else ("fp32", *MOMENTS)
        for s, (_, params) in enumerate(sub_groups):
            offset = 0
            for param in params:
                size = self._partition_numel(param)
                values = {}
                for key in keys:
                    mine = getattr(saved, key)[s].narrow(0, offset, size).float()
                    if self.dp_size > 1:
                        device = _local(param).device
                        mine = gathered(mine.to(device), self._dp_group, self.dp_size)
                    values[key] = mine[: param.numel()].view(param.shape)
                step = None if weights_only else saved.steps[s]
                self.set_parameter_state(param, values, step)
                offset += size
        self.refresh_model_params()


class FullyShardedAdamW(DeepSpeedZero3Files, torch.optim.Optimizer):
    """AdamW over this rank's rows of FSDP2's fp32 sharded parameters; `param_groups` are the
    model's, whose `lr` the trainer's schedule sets. `names` maps each parameter to its name in
    the engine's module (DeepSpeed's `param_shapes` key them so)."""

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
        self._betas, self._eps = betas, eps
        self._zero3_init(names=names, dp_group=data_parallel_group, dp_rank=data_parallel_rank,
                         dp_size=data_parallel_size, sub_group_size=sub_group_size)  # fmt: skip
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
        return self._dp_group if self.dp_size > 1 else None

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

    # --- whole tensors, for DeepSpeed's stage-3 files (DeepSpeedZero3Files) ----------------

    def _rows(self, param: torch.nn.Parameter) -> tuple[int, int]:
        """This rank's first row and row count of `param` (FSDP2's torch.chunk split)."""
        rows = param.shape[0]
        chunk = math.ceil(rows / self.dp_size)
        start = min(self.dp_rank * chunk, rows)
        return start, min(start + chunk, rows) - start

    def _whole(self, param: torch.nn.Parameter, local: torch.Tensor) -> torch.Tensor:
        """The whole tensor of which `local` is this rank's rows (collective over DP)."""
        chunk = math.ceil(param.shape[0] / self.dp_size)
        padded = torch.zeros((chunk, *param.shape[1:]), dtype=local.dtype, device=local.device)
        padded[: local.shape[0]].copy_(local)
        return gathered(padded, self._dp_group, self.dp_size)[: param.shape[0]]

    def whole_state(self, param: torch.nn.Parameter) -> tuple[dict[str, torch.Tensor], int]:
        local = _local(param)
        state = self._state_of(param) if local.numel() else {}
        values = {
            key: self._whole(param, (local if key == "fp32" else state.get(key, local)).float())
            for key in ("fp32", *MOMENTS)
        }
        return values, self._step

    @torch.no_grad()
    def set_parameter_state(
        self, param: torch.nn.Parameter, values: dict[str, torch.Tensor], step: int | None
    ) -> None:
        """This rank's rows of one parameter's fp32 weights (and, given, Adam moments) from whole
        tensors (a reshaped checkpoint's `fp32`, `exp_avg`, `exp_avg_sq`), and the step."""
        if step is not None:
            self._step = step  # the step of states made from now on
        start, count = self._rows(param)
        if not count:
            return
        for key, whole in values.items():
            rows = whole.reshape(param.shape).narrow(0, start, count)
            target = _local(param) if key == "fp32" else self._state_of(param)[key]
            target.copy_(rows.to(target.device, torch.float32))
        if step is not None:
            self._state_of(param)["step"].fill_(float(step))


class SingleRankZero3AdamW(DeepSpeedZero3Files, MasterWeightAdamW):
    """ZeRO-3 at one data-parallel rank, where nothing is sharded: MasterWeightAdamW's step (fp32
    masters of the bf16 weights, CUDA graphs where the run allows them), DeepSpeed's stage-3
    files. torchtitan likewise shards with FSDP2 only above one rank."""

    def __init__(
        self,
        param_groups: list[dict[str, Any]],
        *,
        names: dict[torch.nn.Parameter, str],
        sub_group_size: int = DEFAULT_SUB_GROUP_SIZE,
        **adamw: Any,
    ) -> None:
        MasterWeightAdamW.__init__(self, param_groups, **adamw)
        self._zero3_init(names=names, dp_group=None, dp_rank=0, dp_size=1,
                         sub_group_size=sub_group_size)  # fmt: skip
        self._place = {
            param: (g, i)
            for g, group in enumerate(self.param_groups)
            for i, param in enumerate(group["params"])
        }

    def _master_of(self, param: torch.nn.Parameter) -> torch.Tensor:
        g, i = self._place[param]
        return self.masters[g][i]

    def whole_state(self, param: torch.nn.Parameter) -> tuple[dict[str, torch.Tensor], int]:
        master = self._master_of(param)
        state = self._adamw_state(master)
        values = {"fp32": master, **{key: state[key] for key in MOMENTS}}
        return values, int(state["step"].item())

    @torch.no_grad()
    def set_parameter_state(
        self, param: torch.nn.Parameter, values: dict[str, torch.Tensor], step: int | None
    ) -> None:
        """One parameter's fp32 master (and, given, Adam moments) from whole tensors, and the
        step; the model's weights follow at refresh_model_params."""
        master = self._master_of(param)
        state = self._adamw_state(master)
        for key, whole in values.items():
            target = master if key == "fp32" else state[key]
            target.copy_(whole.reshape(master.shape).to(master.device, torch.float32))
        if step is not None:
            state["step"].fill_(float(step))
        self._kernel_groups.clear()


def _check_names(saved: list[str], mine: list[str]) -> None:
    """ValueError, one line, where the saved partitions name other parameters or another order
    (the sub-groups' sizes are checked before)."""
    if saved == mine:
        return
    shorter = min(len(saved), len(mine))
    index = next((i for i in range(shorter) if saved[i] != mine[i]), shorter)
    theirs = saved[index] if index < len(saved) else "nothing more"
    ours = mine[index] if index < len(mine) else "nothing more"
    raise ValueError(
        f"its ZeRO-3 partitions hold {theirs} where this run's hold {ours} (parameter {index} of "
        "its param_shapes): the parameters or their order differ"
    )
