"""The DeepSpeed internals mds-train relies on (mds_train/deepspeed_engine.py), one test each,
against the installed DeepSpeed: when a release moves one, its test names it.

Each test builds a tiny real engine (two Linear layers) in this process, on CPU, in a one-rank
gloo group, and checks the behaviour mds needs, through the wrapper mds calls. The version refusal
is tested with a faked version.
"""

from __future__ import annotations

import inspect
import os
from datetime import timedelta
from importlib import metadata

import deepspeed
import pytest
import torch
import torch.distributed as dist
from mds_train import deepspeed_engine as ds_engine


@pytest.fixture(scope="module", autouse=True)
def one_rank_group(tmp_path_factory):
    """A one-rank gloo group over a file store (no port), as DeepSpeed's launcher would set up."""
    environment = dict(
        RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500"
    )
    with pytest.MonkeyPatch.context() as patch:
        for name, value in environment.items():
            patch.setenv(name, value)
        store = dist.FileStore(str(tmp_path_factory.mktemp("store") / "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        # DeepSpeed's communication backend over that group, which `deepspeed.initialize` would
        # set up: a PipelineModule needs it when it is built, before any engine.
        deepspeed.init_distributed(dist_backend="gloo")
        try:
            yield
        finally:
            dist.destroy_process_group()


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))


def engine_of(model=None, *, client="adamw", zero_stage=0, **config):
    """A DeepSpeed engine over `model` (tiny_model()) with torch's AdamW (lr 0.1, no weight
    decay) as the client optimizer, `client(parameters)`, or the one the config names when
    `client` is None."""
    model = model or tiny_model()
    if client == "adamw":
        client = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.0)
    elif client is not None:
        client = client(model.parameters())
    ds_config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 2**62,
        "zero_optimization": {"stage": zero_stage},
        "zero_allow_untested_optimizer": True,
        **config,
    }
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        optimizer=client,
        model_parameters=None if client else model.parameters(),
        config=ds_config,
    )
    return engine


def train_step(engine) -> None:
    dtype = next(engine.module.parameters()).dtype
    loss = engine(torch.linspace(-1, 1, 4, dtype=dtype).reshape(1, 4)).float().square().sum()
    engine.backward(loss)
    engine.step()


def flat_values(engine) -> torch.Tensor:
    return torch.cat([p.detach().float().flatten() for p in engine.module.parameters()])


# --- the version check ---


def test_the_installed_deepspeed_is_a_tested_version():
    """A new DeepSpeed release fails here first: check the tests below, then add it."""
    installed = metadata.version("deepspeed")
    assert ".".join(installed.split(".")[:2]) in ds_engine.TESTED_VERSIONS, installed
    ds_engine.check_version(environ={})


@pytest.mark.parametrize("version", ["0.18.5", "0.20.0", "1.19.0"])
def test_an_untested_version_is_refused_unless_overridden(version):
    with pytest.raises(ValueError, match=f"DeepSpeed {version} is installed") as error:
        ds_engine.check_version(version, environ={})
    message = str(error.value)
    assert "\n" not in message and "0.19.x" in message and ds_engine.UNTESTED_OVERRIDE in message
    ds_engine.check_version(version, environ={ds_engine.UNTESTED_OVERRIDE: "1"})
    ds_engine.check_version("0.19.0rc1", environ={})


def test_mds_train_refuses_an_untested_deepspeed_before_anything_else(
    capsys, monkeypatch, shared_data
):
    """One line and exit 1, after the flags are checked and before the data are read (there are
    none here) or DeepSpeed is imported."""
    from mds_train.cli import main

    real = metadata.version
    monkeypatch.setattr(
        ds_engine.metadata,
        "version",
        lambda name: "0.20.1" if name == "deepspeed" else real(name),
    )
    monkeypatch.delenv(ds_engine.UNTESTED_OVERRIDE, raising=False)
    argv = [
        *["--data-path", "D", "--vocab-file", str(shared_data / "gpt2-vocab.json")],
        *["--merge-file", str(shared_data / "gpt2-merges.txt"), "--num-layers", "2"],
        *"--hidden-size 8 --num-attention-heads 2 --seq-length 8 --micro-batch-size 2".split(),
        *"--lr 1e-3 --train-iters 5".split(),
    ]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 1
    assert (
        err.startswith("mds-train: error: DeepSpeed 0.20.1 is installed; ") and err.count("\n") == 1
    ), err


# --- the engine ---


def test_clip_fp32_gradients_is_what_the_engine_calls_and_its_norm_is_reported():
    """`_take_model_step` calls `clip_fp32_gradients` (fp32, no ZeRO, clipping on) and
    `get_global_grad_norm` returns what the replacement stored in `_global_grad_norm`."""
    engine = engine_of(gradient_clipping=1.0)
    calls = []

    def clip():
        calls.append([p.grad is not None for p in engine.module.parameters()])
        return torch.tensor(7.0)

    ds_engine.replace_fp32_clipping(engine, clip)
    train_step(engine)
    assert calls == [[True] * 4]  # once per step, with the gradients in place
    assert float(engine.get_global_grad_norm()) == 7.0


def test_skip_backward_allreduce_stops_the_engine_s_gradient_reduction(monkeypatch):
    engine = engine_of()
    reductions = []
    monkeypatch.setattr(engine, "allreduce_gradients", lambda *a, **k: reductions.append(1))
    train_step(engine)
    assert reductions == [1]  # DeepSpeed's own, at the accumulation boundary
    ds_engine.skip_backward_allreduce(engine)
    train_step(engine)
    assert reductions == [1]


def test_built_optimizer_is_the_one_whose_learning_rate_the_step_uses():
    """With the config's `optimizer` section DeepSpeed builds the optimizer; the schedule sets
    the learning rate on `built_optimizer`'s groups."""
    engine = engine_of(
        client=None,  # torch's AdamW (DeepSpeed's own would be JIT-built here first, for minutes)
        optimizer={"type": "AdamW", "params": {"lr": 0.1, "torch_adam": True}},
    )
    built = ds_engine.built_optimizer(engine)
    assert isinstance(built, torch.optim.Optimizer)
    for group in built.param_groups:
        group["lr"] = 0.0
    before = flat_values(engine)
    train_step(engine)
    assert torch.equal(flat_values(engine), before)
    for group in built.param_groups:
        group["lr"] = 0.1
    train_step(engine)
    assert not torch.equal(flat_values(engine), before)


def pipeline_engine():
    from deepspeed.pipe import LayerSpec, PipelineModule

    torch.manual_seed(0)
    module = PipelineModule(
        layers=[LayerSpec(torch.nn.Linear, 4, 3), LayerSpec(torch.nn.Linear, 3, 2)],
        num_stages=1,
        loss_fn=lambda output, target: (output - target).square().mean(),
    )
    return engine_of(module)


def test_the_pipeline_engine_s_model_parallel_group_and_replication_marks():
    """`engine.mpu` of a pipeline engine is the PipelineModule's grid; every parameter carries
    `ds_pipe_replicated` (True on a non-first stage's tied copy, which DeepSpeed's own
    half-precision norms skip under that name)."""
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.constants import PIPE_REPLICATED

    engine = pipeline_engine()
    group = ds_engine.pipeline_model_parallel_group(engine)
    assert dist.get_world_size(group) == 1  # TP x PP = 1 here
    assert ds_engine.is_pipeline_engine(engine) and not ds_engine.is_pipeline_engine(engine_of())
    assert PIPE_REPLICATED == "ds_pipe_replicated"
    params = list(engine.module.parameters())
    assert all(hasattr(p, PIPE_REPLICATED) for p in params)
    assert not any(ds_engine.replicated_by_pipeline(p) for p in params)
    assert "p.ds_pipe_replicated = True" in inspect.getsource(PipelineModule._index_tied_modules)


def test_set_progress_sets_the_counters_deepspeed_saves_and_loads(tmp_path):
    engine = engine_of()
    ds_engine.set_progress(engine, iteration=12, consumed_samples=96)
    engine.save_checkpoint(str(tmp_path), tag="step12")
    saved = torch.load(
        tmp_path / "step12" / "mp_rank_00_model_states.pt", weights_only=False, map_location="cpu"
    )
    assert (saved["global_steps"], saved["global_samples"]) == (12, 96)
    resumed = engine_of()
    resumed.load_checkpoint(str(tmp_path), tag="step12")  # DeepSpeed's own optimizer load
    assert (resumed.global_steps, resumed.global_samples) == (12, 96)


def test_the_checkpoint_engine_reads_files_through_the_given_load(tmp_path):
    engine = engine_of()
    engine.save_checkpoint(str(tmp_path), tag="t")
    opened = []

    def load(path, map_location):
        opened.append(os.path.basename(path))
        return torch.load(path, map_location=map_location, weights_only=False)

    with ds_engine.checkpoint_engine_loading_with(engine, load):
        engine.load_checkpoint(str(tmp_path), tag="t")
    assert "mp_rank_00_model_states.pt" in opened
    opened.clear()
    engine.load_checkpoint(str(tmp_path), tag="t")  # restored on leaving
    assert opened == []


class CountingAdamW(torch.optim.AdamW):
    """As MasterWeightAdamW: an optimizer with fp32 masters to refresh after a weights load."""

    def __init__(self, params):
        super().__init__(params, lr=0.1, weight_decay=0.0)
        self.refreshes = 0

    def refresh_fp32_params(self) -> None:
        self.refreshes += 1


def test_a_module_only_load_refreshes_the_client_optimizer_s_masters(tmp_path):
    engine = engine_of(client=CountingAdamW)
    engine.save_checkpoint(str(tmp_path), tag="t")
    engine.load_checkpoint(str(tmp_path), tag="t", load_module_only=True)
    assert engine.optimizer.refreshes == 1  # DeepSpeed calls it by that name
    ds_engine.refresh_master_weights(engine)
    assert engine.optimizer.refreshes == 2
    ds_engine.refresh_master_weights(engine_of())  # torch's AdamW has none: nothing to do


def test_the_loss_scale_and_dynamic_scaler_of_deepspeed_s_optimizers():
    """ZeRO optimizers keep a `loss_scaler` (static without fp16: nothing to restore) and show
    its scale as `cur_scale`; a `DynamicLossScaler`'s running state is the four fields
    mds_checkpoint records (fp16 needs a GPU, so the scaler is built as ZeRO builds it)."""
    from deepspeed.runtime.fp16.loss_scaler import CreateLossScaler
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
    from mds_checkpoint.loss_scale import STATE_FIELDS

    engine = engine_of(zero_stage=1)
    assert ds_engine.current_loss_scale(engine) == 1.0
    assert ds_engine.dynamic_loss_scaler(engine.optimizer) is None
    assert "self.loss_scaler = CreateLossScaler(" in inspect.getsource(DeepSpeedZeroOptimizer)

    args = {
        "init_scale": 2.0**10,
        "scale_window": 1000,
        "min_scale": 1.0,
        "delayed_shift": 2,
        "consecutive_hysteresis": False,
    }
    scaler = CreateLossScaler(torch.half, 0, True, args)
    holder = type("Optimizer", (), {"loss_scaler": scaler})()
    assert ds_engine.dynamic_loss_scaler(holder) is scaler
    state = {"cur_scale": 256.0, "cur_iter": 40, "last_overflow_iter": 30, "cur_hysteresis": 1}
    assert set(state) == set(STATE_FIELDS)
    ds_engine.set_loss_scaler_state(scaler, **state)
    scaler.update_scale(True)  # an overflow with the hysteresis spent halves the scale
    assert (scaler.cur_scale, scaler.last_overflow_iter, scaler.cur_iter) == (128.0, 40, 41)


def test_the_default_process_group_timeout():
    timeout = ds_engine.default_process_group_timeout()
    assert isinstance(timeout, timedelta) and timeout > timedelta(0)
    assert inspect.signature(deepspeed.init_distributed).parameters["timeout"].default == timeout


def test_fp32_mode_steps_a_bf16_model_s_client_optimizer_as_it_is():
    """No fp16/bf16 section, ZeRO-0: DeepSpeed wraps nothing, so MasterWeightAdamW over bf16
    weights is the engine's optimizer and its fp32 masters take the step."""
    from mds_train.master_weights import MasterWeightAdamW

    model = tiny_model().bfloat16()
    groups = [{"params": list(model.parameters()), "weight_decay": 0.0, "lr": 0.1}]
    client = MasterWeightAdamW(groups, betas=(0.9, 0.95), eps=1e-8)
    engine = engine_of(model, client=lambda _: client)
    assert engine.optimizer is client
    before = [master.clone() for master in client.masters[0]]
    train_step(engine)
    assert all(p.dtype == torch.bfloat16 for p in engine.module.parameters())
    changed = [not torch.equal(a, b) for a, b in zip(before, client.masters[0], strict=True)]
    assert all(changed)


# --- ZeRO-1/2 and the BF16 optimizer ---

FRAGMENT_ENGINES = {
    "zero1 fp32": {"zero_stage": 1},
    "zero2 fp32": {"zero_stage": 2},
    "zero1 bf16": {"zero_stage": 1, "bf16": {"enabled": True}},
    "bf16 optimizer": {  # what ds_config derives for a bf16 pipeline
        "zero_stage": 1,
        "bf16": {"enabled": True},
        "data_types": {"grad_accum_dtype": "fp32"},
    },
}


@pytest.mark.parametrize("kind", FRAGMENT_ENGINES)
def test_each_parameter_s_fragment_of_the_flat_fp32_partition(kind):
    """`_hp_mapping` places each parameter in the inner optimizer's flat partition: its fp32
    values there, and after a step its Adam moments at the same place; the client optimizer is
    the inner one (its groups carry the learning rate)."""
    model = tiny_model()
    if "bf16" in kind:
        model = model.bfloat16()
    client = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.0)
    engine = engine_of(model, client=lambda _: client, **FRAGMENT_ENGINES[kind])
    inner = ds_engine.inner_optimizer(engine.optimizer)
    assert inner is client
    train_step(engine)
    for param in engine.module.parameters():
        assert ds_engine.has_fragment_mapping(param)
        fragment = ds_engine.fragment_of(param)  # one rank: the whole parameter
        assert (fragment.start, fragment.numel) == (0, param.numel())
        assert fragment.master.dtype == torch.float32
        torch.testing.assert_close(fragment.master.to(param.dtype), param.detach().flatten())
        flat = inner.param_groups[fragment.group_index]["params"][0]
        where = flat.narrow(0, fragment.partition_start, fragment.numel)
        assert where.data_ptr() == fragment.master.data_ptr()
        moment = inner.state[flat]["exp_avg"].narrow(0, fragment.partition_start, fragment.numel)
        full = deepspeed.utils.safe_get_full_optimizer_state(param, "exp_avg")
        torch.testing.assert_close(full.flatten(), moment)


@pytest.mark.parametrize("kind", ["zero2 fp32", "bf16 optimizer"])
def test_relinking_makes_the_fragments_view_a_replaced_optimizer_state(kind):
    """reshaped.py may put new moment tensors into the inner optimizer's state; after
    `relink_optimizer_state` DeepSpeed's fragments view those at the next step."""
    model = tiny_model()
    if "bf16" in kind:
        model = model.bfloat16()
    engine = engine_of(model, **FRAGMENT_ENGINES[kind])
    assert hasattr(engine.optimizer, "_hp_optimizer_states_linked")
    train_step(engine)  # links the fragments to the first state
    inner = ds_engine.inner_optimizer(engine.optimizer)
    for state in inner.state.values():
        state["exp_avg"] = torch.full_like(state["exp_avg"], 3.0)
    ds_engine.relink_optimizer_state(engine.optimizer)
    train_step(engine)
    for param in engine.module.parameters():
        fragment = ds_engine.fragment_of(param)
        flat = inner.param_groups[fragment.group_index]["params"][0]
        moment = inner.state[flat]["exp_avg"].narrow(0, fragment.partition_start, fragment.numel)
        full = deepspeed.utils.safe_get_full_optimizer_state(param, "exp_avg")
        torch.testing.assert_close(full.flatten(), moment)


# --- ZeRO-3 ---


@pytest.mark.parametrize("stage", [1, 2])
def test_the_partition_state_dict_is_deepspeed_s_own(stage):
    """deepspeed_optimizer_state, given the values DeepSpeed's own bf16 optimizer holds (its BF16
    optimizer at ZeRO-1, its ZeRO optimizer at ZeRO-2), builds the state dict that optimizer
    saves: the same keys, values and types; saved_partition reads it back."""
    model = tiny_model().bfloat16()
    kind = FRAGMENT_ENGINES["bf16 optimizer"] if stage == 1 else {"zero_stage": 2}
    engine = engine_of(model, **{"bf16": {"enabled": True}, **kind})
    train_step(engine)
    theirs = engine.optimizer.state_dict()
    padded = (
        engine.optimizer.fp32_groups_flat_partition
        if stage == 1
        else engine.optimizer.single_partition_of_fp32_groups
    )
    state = ds_engine.PartitionState(
        base=theirs["base_optimizer_state"],
        partitions=list(padded),
        paddings=list(theirs["group_paddings"]),
        dp_size=1,
        fragments=[
            [(name, address.numel, address.start) for name, address in group.items()]
            for group in theirs["param_slice_mappings"]
        ],
        param_counts=[len(group) for group in theirs["param_slice_mappings"]],
    )
    ours = ds_engine.deepspeed_optimizer_state(state, stage=stage, clip_grad=theirs["clip_grad"])
    assert list(ours) == list(theirs)
    for key, value in theirs.items():
        mine = ours[key]
        if key == "single_partition_of_fp32_groups":
            for a, b in zip(mine, value, strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=0)
        elif key == "loss_scaler":
            assert type(mine) is type(value) and mine.cur_scale == value.cur_scale
        elif key != "base_optimizer_state":
            assert mine == value, key
    read = ds_engine.saved_partition(ours)
    assert read.partition_counts == [1] * len(padded)
    assert read.base is theirs["base_optimizer_state"]


def test_zero3_partitions_sub_groups_and_masters():
    """Each parameter's `ds_tensor` is its partition (`partition_numel` values from
    `rank * partition_numel`; one rank: all of it), laid end to end in its sub-group's fp32
    master; `ds_shape` is the whole shape. Inside `zero3_all_partitioned` none is gathered."""
    model = tiny_model()
    shapes = [tuple(p.shape) for p in model.parameters()]
    values = [p.detach().clone().flatten() for p in model.parameters()]
    engine = engine_of(model, zero_stage=3)
    ds_optimizer = engine.optimizer
    assert not ds_engine.zero3_keeps_partitions_on_nvme(ds_optimizer)
    sub_groups = ds_engine.zero3_sub_groups(ds_optimizer)
    assert sum(len(group.params) for group in sub_groups) == len(shapes)
    with ds_engine.zero3_all_partitioned(ds_optimizer):
        seen = []
        for sub_group in sub_groups:
            assert "lr" in sub_group.param_group
            offset = 0
            for param in sub_group.params:
                part = ds_engine.zero3_partition(ds_optimizer, param)
                assert param.numel() == 0  # released: only the partition holds values
                assert ds_engine.zero3_full_shape(param) == part.shape
                assert (part.rank, part.world_size, part.numel) == (0, 1, param.ds_numel)
                master = sub_group.master.narrow(0, offset, part.numel)
                torch.testing.assert_close(master, part.local.float())
                seen.append((part.shape, part.local.clone()))
                offset += part.numel
            assert offset == sub_group.master.numel()
    assert sorted(shape for shape, _ in seen) == sorted(shapes)
    by_shape = dict(seen)
    for shape, value in zip(shapes, values, strict=True):
        torch.testing.assert_close(by_shape[shape], value)


def test_the_zero3_state_dict_is_deepspeed_s_own():
    """zero3_optimizer_state, given the values DeepSpeed's own bf16 stage 3 holds after a step,
    builds the state dict its optimizer saves (`_rigid_state_dict`): the same keys in the same
    order, the same inner AdamW groups and state; saved_zero3_state reads it back."""
    model = tiny_model().bfloat16()
    engine = engine_of(model, zero_stage=3, bf16={"enabled": True})
    train_step(engine)
    theirs = engine.optimizer.state_dict()
    base = theirs["optimizer_state_dict"]
    indices = [i for group in base["param_groups"] for i in group["params"]]
    state = ds_engine.Zero3State(
        groups=[
            {k: v for k, v in g.items() if k not in ("params", "betas", "eps")}
            for g in base["param_groups"]
        ],
        sub_group_of=[g for g, group in enumerate(base["param_groups"]) for _ in group["params"]],
        fp32=list(theirs["fp32_flat_groups"]),
        exp_avg=[base["state"][i]["exp_avg"] for i in indices],
        exp_avg_sq=[base["state"][i]["exp_avg_sq"] for i in indices],
        steps=[int(base["state"][i]["step"]) for i in indices],
        dp_size=1,
    )
    betas, eps = base["param_groups"][0]["betas"], base["param_groups"][0]["eps"]
    ours = ds_engine.zero3_optimizer_state(state, betas=betas, eps=eps)
    assert list(ours) == list(theirs)
    for key, value in theirs.items():
        mine = ours[key]
        if key == "fp32_flat_groups":
            for a, b in zip(mine, value, strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=0)
        elif key == "loss_scaler":
            assert type(mine) is type(value) and vars(mine) == vars(value)
        elif key == "optimizer_state_dict":
            assert mine["param_groups"] == value["param_groups"]
            assert list(mine["state"]) == list(value["state"])
            for index, moments in value["state"].items():
                assert list(mine["state"][index]) == list(moments)
                for name, tensor in moments.items():
                    torch.testing.assert_close(mine["state"][index][name], tensor)
        else:
            assert mine == value, key
    read = ds_engine.saved_zero3_state(ours)
    assert read.dp_size == 1 and read.steps == [1] * len(indices)


def test_upstream_s_zero3_optimizer_loads_our_partition_file():
    """DeepSpeed's own bf16 stage 3 with its optimizer built as upstream's pretrain_gpt.py builds
    it (the model under `deepspeed.zero.Init`, so Megatron's `get_param_groups`, whose test is
    `name.endswith(".bias") or len(param.shape) == 1`, puts every (0,)-shaped placeholder in
    its one no-weight-decay group, in module order) loads the state dict mds-train's ZeRO-3
    writes (two groups inside, 2-D weights decayed): its fp32 partitions, moments, step and
    weights are ours, in module order."""
    from mds_train.fully_sharded import SingleRankZero3AdamW
    from mds_train.param_groups import UPSTREAM_GROUP_KEYS

    model = tiny_model().bfloat16()
    decayed = [p for p in model.parameters() if p.dim() == 2]
    others = [p for p in model.parameters() if p.dim() != 2]
    ours = SingleRankZero3AdamW(
        [
            {"params": decayed, "weight_decay": 0.1, "lr": 0.01, **UPSTREAM_GROUP_KEYS[0]},
            {"params": others, "weight_decay": 0.0, "lr": 0.01, **UPSTREAM_GROUP_KEYS[1]},
        ],
        names={p: n for n, p in model.named_parameters()},
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    torch.manual_seed(1)
    for _ in range(2):
        for param in model.parameters():
            param.grad = torch.randn_like(param)
        ours.step()
    saved = ours.state_dict()
    masters = [ours.whole_state(p)[0] for p in model.parameters()]

    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
              "bf16": {"enabled": True}}  # fmt: skip
    with deepspeed.zero.Init(config_dict_or_path=config):
        placeholder = tiny_model().bfloat16()
    named = list(placeholder.named_parameters())
    assert all(n.endswith(".bias") or len(p.shape) == 1 for n, p in named)  # all no-decay
    group = {"params": [p for _, p in named], **UPSTREAM_GROUP_KEYS[1]}
    client = torch.optim.AdamW([group], lr=0.0, weight_decay=0.0)
    engine = engine_of(placeholder, client=lambda _: client, zero_stage=3, bf16={"enabled": True})
    engine.optimizer.load_state_dict([saved])

    ds_optimizer = engine.optimizer
    flats, inner = ds_optimizer.fp32_partitioned_groups_flat, ds_optimizer.optimizer
    for key in ("fp32", "exp_avg", "exp_avg_sq"):
        expected = torch.cat([m[key].reshape(-1) for m in masters])
        found = torch.cat([flat if key == "fp32" else inner.state[flat][key] for flat in flats])
        torch.testing.assert_close(found, expected, rtol=0, atol=0, msg=key)
    assert [int(inner.state[flat]["step"]) for flat in flats] == [2] * len(flats)
    inner_group = ds_optimizer.optimizer.param_groups[0]
    assert {k: inner_group[k] for k in ("name", "wd_mult", "lr_mult", "weight_decay", "lr")} == {
        **UPSTREAM_GROUP_KEYS[1], "weight_decay": 0.0, "lr": 0.01}  # fmt: skip
    with deepspeed.zero.GatheredParameters(list(placeholder.parameters())):
        for param, master in zip(placeholder.parameters(), masters, strict=True):
            torch.testing.assert_close(param.detach(), master["fp32"].bfloat16(), rtol=0, atol=0)


def test_writing_zero3_model_file_names_it_as_stage_3_does(tmp_path):
    """A stage-0 engine's save under writing_zero3_model_file writes the file DeepSpeed's own
    stage 3 writes for the rank (`zero_pp_rank_0_mp_rank_00_model_states.pt`), with the client
    state applied after the engine's keys, and nothing under the stage-0 name; the engine's own
    naming comes back after."""
    stage3 = engine_of(zero_stage=3)
    stage3.save_checkpoint(str(tmp_path / "stage3"), tag="t")
    engine = engine_of()
    with ds_engine.writing_zero3_model_file(engine, 0):
        engine.save_checkpoint(str(tmp_path / "ours"), tag="t", client_state={"optimizer": None})
    theirs = sorted(p.name for p in (tmp_path / "stage3" / "t").glob("*model_states.pt"))
    assert sorted(p.name for p in (tmp_path / "ours" / "t").glob("*model_states.pt")) == theirs
    saved = torch.load(tmp_path / "ours" / "t" / theirs[0], weights_only=False)
    assert saved["optimizer"] is None
    engine.save_checkpoint(str(tmp_path / "after"), tag="t")
    assert [p.name for p in (tmp_path / "after" / "t").glob("*model_states.pt")] == [
        "mp_rank_00_model_states.pt"
    ]


# --- used by the sibling packages (mds_checkpoint, mds_model) ---


def test_partition_balanced_splits_layers_as_upstream_s_pipeline():
    """mds_checkpoint.engine_names cuts layers into stages as DeepSpeed's PipelineModule does
    (`partition_method="parameters"` weights through `partition_balanced`)."""
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.utils import partition_balanced

    # mds_checkpoint's weights for 4 layers: embedding slots, the layers, norm/head/logits slots
    weights = [0, 0, 1, 1, 1, 1, 0, 0, 0]
    assert partition_balanced(weights=weights, num_parts=2) == [0, 4, 9]
    assert partition_balanced(weights=weights, num_parts=4) == [0, 3, 4, 5, 9]
    assert "partition_balanced(weights=binary_weights, num_parts=num_stages)" in inspect.getsource(
        PipelineModule._partition_layers
    )


def test_the_pipe_model_data_parallel_topology_mds_model_builds():
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    topology = PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=1)
    assert topology.get_axis_names() == ["pipe", "data", "model"]
    assert topology.get_rank(pipe=1, data=0, model=1) == 3


def test_a_pipeline_module_finds_each_layer_s_files_through_ckpt_layer_path_list(tmp_path):
    """mds_model's GPTPipe reads layer files in bigscience's numbering by overriding
    `ckpt_layer_path_list(ckpt_dir, local_layer_idx)`: DeepSpeed's `load_state_dir` asks it for
    the files of each local layer that holds parameters, and the layer's spec index is the local
    one plus `partitions()[stage_id]` (what DeepSpeed's own version reads as `_local_start`)."""
    from glob import glob

    from deepspeed.pipe import LayerSpec, PipelineModule

    class Shifted(PipelineModule):
        """Reads spec index k from the files saved as layer k + 10."""

        def __init__(self, **kwargs) -> None:
            super().__init__(**kwargs)
            self.asked: list[int] = []

        def ckpt_layer_path_list(self, ckpt_dir, local_layer_idx):
            self.asked.append(local_layer_idx)
            index = local_layer_idx + self.partitions()[self.stage_id]
            return sorted(glob(os.path.join(ckpt_dir, f"layer_{index + 10:02d}-*model_states.pt")))

    def module(seed: int) -> Shifted:
        torch.manual_seed(seed)
        layers = [LayerSpec(torch.nn.Linear, 4, 3), torch.nn.functional.relu]
        layers.append(LayerSpec(torch.nn.Linear, 3, 2))
        return Shifted(layers=layers, num_stages=1, loss_fn=lambda output, target: output.sum())

    saved = engine_of(module(0))
    saved.save_checkpoint(str(tmp_path), tag="t")
    for path in sorted((tmp_path / "t").glob("layer_*-model_states.pt")):
        index = int(path.name[len("layer_") :].partition("-")[0])
        path.rename(path.with_name(f"layer_{index + 10:02d}-" + path.name.partition("-")[2]))
    loaded = engine_of(module(1))
    assert not torch.equal(flat_values(loaded), flat_values(saved))
    loaded.load_checkpoint(str(tmp_path), tag="t", load_module_only=True)
    assert torch.equal(flat_values(loaded), flat_values(saved))
    assert loaded.module.asked == [0, 2]  # the function at spec index 1 holds no state
    assert loaded.module.partitions()[loaded.module.stage_id] == loaded.module._local_start == 0
    # On a later stage (PP > 1, which one process cannot build) the first local spec index is
    # the stage's partition start: `_partition_layers` sets the bounds from `parts[stage_id]`.
    assert "self._set_bounds(start=self.parts[stage_id]," in inspect.getsource(
        PipelineModule._partition_layers
    )
    assert "stage_id = self._topo.get_coord(self.global_rank).pipe" in inspect.getsource(
        PipelineModule._partition_layers
    )
    assert "self.stage_id = self._topo.get_coord(self.global_rank).pipe" in inspect.getsource(
        PipelineModule.__init__
    )
    assert "return self.parts" in inspect.getsource(PipelineModule.partitions)
