"""mds-train's losses against a plain PyTorch loop written here, a checked-in baseline, and its own
parallel layouts (TP=2, PP=2, DP=2 with ZeRO 1-3, TP2 x PP2) under the deepspeed launcher; the
batch-size ramp-up against a loop that ramps by hand, resumed mid-ramp and at DP=2."""

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from mds_checkpoint.engine_names import megatron_flat

BASELINE = Path(__file__).with_name("baseline_losses.json")
ITERATIONS, MICRO, GLOBAL, SEQ = 20, 2, 8, 64


def hand_lr(samples: int) -> float:
    """The reference schedule by hand: 3 warmup iterations of 8 samples, cosine to 5e-4 over 20."""
    warmup, decay, peak, floor = 3 * GLOBAL, ITERATIONS * GLOBAL, 5e-3, 5e-4
    if samples <= warmup:
        return peak * samples / warmup
    ratio = (samples - warmup) / (decay - warmup)
    return floor + (peak - floor) * 0.5 * (math.cos(math.pi * ratio) + 1)


def megatron_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Megatron's _get_params_for_weight_decay_optimization: no decay in norms or on biases."""
    decay, no_decay = [], []
    for module in model.modules():
        is_norm = "LayerNorm" in type(module).__name__
        for name, param in module.named_parameters(recurse=False):
            (no_decay if is_norm or name == "bias" else decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0},
    ]


def tiny_gpt() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The runs' model (runs.MODEL without dropout) and AdamW as runs.OPTIMIZER sets it."""
    from mds_model import GPT, GPTConfig

    config = GPTConfig(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        vocab_size=5000,
        seq_length=SEQ,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_fused_kernels=False,
    )
    model = GPT(config, init_seed=1234)
    optimizer = torch.optim.AdamW(megatron_groups(model, 0.1), lr=0.0, betas=(0.9, 0.95), eps=1e-8)
    return model, optimizer


def train_dataset(shared_data: Path, cache: Path, counts: tuple[int, int, int]):
    """The golden data's train split, built for Megatron's (train, valid, test) sample counts."""
    from mds_indexed_data import GPTDataConfig, build_train_valid_test_datasets

    data = GPTDataConfig.from_data_path(
        [str(shared_data / "megatron-golden/meg-gpt2-openwebtext_text_document")],
        seq_length=SEQ,
        num_samples=counts,
        split="949,50,1",
        seed=1234,
        cache_dir=str(cache),
    )
    return build_train_valid_test_datasets(data).train


def sample_loss(model: torch.nn.Module, train, first: int, size: int) -> torch.Tensor:
    """The mean token loss of samples [first, first + size): inputs and labels shifted by one."""
    from mds_model import masked_mean

    samples = torch.from_numpy(np.stack([train[i] for i in range(first, first + size)]))
    tokens, labels = samples[:, :-1], samples[:, 1:]
    return masked_mean(model(tokens, labels), torch.ones(tokens.shape))


def plain_pytorch_losses(shared_data: Path, cache: Path) -> list[float]:
    model, optimizer = tiny_gpt()
    # Megatron's sample counts: train iters x batch; valid (iters // interval + 1) x eval iters.
    counts = (ITERATIONS * GLOBAL, (ITERATIONS // 10 + 1) * 1 * GLOBAL, 1 * GLOBAL)
    train = train_dataset(shared_data, cache, counts)
    losses, consumed = [], 0
    for _ in range(ITERATIONS):
        for group in optimizer.param_groups:
            group["lr"] = hand_lr(consumed)
        total = 0.0
        for micro in range(GLOBAL // MICRO):  # one data-parallel rank takes every sample in order
            loss = sample_loss(model, train, consumed + micro * MICRO, MICRO) / (GLOBAL // MICRO)
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        consumed += GLOBAL
        losses.append(total)
    return losses


def test_losses_equal_a_plain_pytorch_loop(runs, reference_run, shared_data, data_cache):
    ours = runs.losses(reference_run)
    theirs = plain_pytorch_losses(shared_data, data_cache)
    assert sorted(ours) == list(range(1, ITERATIONS + 1))
    for iteration, expected in enumerate(theirs, start=1):
        assert ours[iteration] == pytest.approx(expected, rel=1e-5), iteration
    assert ours[ITERATIONS] < ours[1] - 0.5  # and it learns


# The baseline was written on one machine; another CPU sums fp32 in another order (other SIMD
# widths, other BLAS blocking), a few ulps (u = 6e-8) per operation, and 20 optimizer steps amplify
# that. Two 2-core machines of CI's kind differed by 6.4e-8 relative at iteration 19. 2e-5 (~300 u)
# leaves room for other kernels and is still far below what a change of the data, the schedule or
# the math moves a loss by. Exact equality is kept where both sides run here (resumes, layouts).
BASELINE_RTOL = 2e-5


def assert_matches_baseline(losses: dict[int, float], baseline: dict[int, float]) -> None:
    assert sorted(losses) == sorted(baseline)
    for iteration, expected in baseline.items():
        assert losses[iteration] == pytest.approx(expected, rel=BASELINE_RTOL, abs=0), iteration


def test_checked_in_baseline_is_reproduced(runs, reference_run):
    baseline = {int(k): v for k, v in json.loads(BASELINE.read_text())["lm_loss"].items()}
    assert_matches_baseline(runs.losses(reference_run), baseline)


def test_baseline_tolerance_takes_reduction_order_noise_and_nothing_more():
    baseline = {int(k): v for k, v in json.loads(BASELINE.read_text())["lm_loss"].items()}
    # Another machine's losses: every iteration off by up to half the tolerance, either way.
    noisy = {i: v * (1 + (-1) ** i * BASELINE_RTOL / 2) for i, v in baseline.items()}
    assert_matches_baseline(noisy, baseline)
    for iteration in (1, 19):  # one iteration off by twice the tolerance is a failure
        changed = {**baseline, iteration: baseline[iteration] * (1 + 2 * BASELINE_RTOL)}
        with pytest.raises(AssertionError):
            assert_matches_baseline(changed, baseline)
    with pytest.raises(AssertionError):  # a missing iteration too
        assert_matches_baseline({i: v for i, v in baseline.items() if i != 20}, baseline)


LAYOUTS = {
    "tp2": (2, ["--tensor-model-parallel-size", "2"]),
    "pp2": (2, ["--pipeline-model-parallel-size", "2"]),
    "dp2-zero1": (2, ["--zero-stage", "1"]),
    "dp2-zero2": (2, ["--zero-stage", "2"]),
    "dp2-zero3": (2, ["--zero-stage", "3"]),
    "tp2-pp2": (4, ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"]),
}


def offload_config(tmp_path: Path) -> list[str]:
    """The seed walk-through's ZeRO-3 file: the deprecated `"cpu_offload": true` (DeepSpeed's CPU
    Adam, built just in time on first use), and a batch and clip that agree with the flags."""
    path = tmp_path / "ds_zero3_offload.json"
    config = {
        "train_batch_size": GLOBAL,
        "zero_optimization": {"stage": 3, "cpu_offload": True},
        "gradient_clipping": 1.0,
        "steps_per_print": 1000,
        "wall_clock_breakdown": False,
    }
    path.write_text(json.dumps(config))
    return ["--zero-stage", "3", "--deepspeed_config", str(path)]


LAYOUTS["dp2-zero3-offload"] = (2, offload_config)


@pytest.mark.multiprocess
@pytest.mark.parametrize("layout", LAYOUTS)
def test_parallel_layouts_match_one_process(
    layout, runs, reference_run, shared_data, data_cache, tmp_path
):
    nproc, flags = LAYOUTS[layout]
    flags = flags(tmp_path) if callable(flags) else flags
    iterations = 8
    result = runs.train(
        [
            *runs.MODEL,
            *runs.OPTIMIZER,
            *runs.NO_DROPOUT,
            *runs.data_flags(shared_data, data_cache),
            *f"--train-iters {ITERATIONS} --exit-interval {iterations} --log-interval 1".split(),
            *"--eval-interval 10 --eval-iters 1".split(),
            "--output-dir",
            str(tmp_path),
            *flags,
        ],
        nproc=nproc,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    runs.assert_losses_match(tmp_path, reference_run, iterations)
    if layout.endswith("offload"):
        assert '"cpu_offload": true is deprecated' in result.stderr


# --- batch-size ramp-up ---------------------------------------------------------------------
# --rampup-batch-size 2 2 60 to a global batch of 12, one sample per micro-batch, 150 samples: the
# accumulation steps go 2, 4, 6, 8, 10, 12, and from 8 on they no longer divide the micro-batches
# taken before (where DeepSpeed's own count of boundaries went astray).
RAMP_SAMPLES, RAMP_GLOBAL = 150, 12
RAMP_FLAGS = (
    "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 "
    "--micro-batch-size 1 --global-batch-size 12 --rampup-batch-size 2 2 60 --train-samples 150 "
    "--lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-samples 20 --weight-decay 0.1 "
    "--clip-grad 1.0 --adam-beta1 0.9 --adam-beta2 0.95 --adam-eps 1e-8 --seed 1234 "
    "--hidden-dropout 0 --attention-dropout 0 --log-interval 1 --eval-iters 0"
).split()
# Progress fields of a log record that a resumed run must reproduce bit for bit.
PROGRESS = ("lm_loss", "learning_rate", "grad_norm", "consumed_samples", "consumed_tokens")


def ramp_batch(consumed: int) -> int:
    """Megatron's RampupBatchsizeNumMicroBatches by hand: (12 - 2) / 2 = 5 increments of 2, one
    every 60 / 5 = 12 samples while at most 60 samples are consumed, then 12."""
    return RAMP_GLOBAL if consumed > 60 else 2 + 2 * int(consumed / 12)


def ramp_lr(samples: int) -> float:
    """AnnealingLR over samples: 20 warmup samples to 1e-3, cosine to 1e-4 at 150."""
    if samples <= 20:
        return 1e-3 * samples / 20
    ratio = (samples - 20) / (RAMP_SAMPLES - 20)
    return 1e-4 + (1e-3 - 1e-4) * 0.5 * (math.cos(math.pi * ratio) + 1)


def plain_pytorch_ramp(shared_data: Path, cache: Path) -> tuple[list[dict], dict]:
    """Each iteration's record as mds-train logs it, and the final weights, of a loop that ramps
    the batch by hand: one optimizer step per iteration over all of its samples."""
    model, optimizer = tiny_gpt()
    train = train_dataset(shared_data, cache, (RAMP_SAMPLES, 0, 0))  # --eval-iters 0
    records, consumed = [], 0
    while consumed + ramp_batch(consumed) <= RAMP_SAMPLES:  # a partial last batch is dropped
        batch = ramp_batch(consumed)
        for group in optimizer.param_groups:
            group["lr"] = ramp_lr(consumed)
        total = 0.0
        for first in range(consumed, consumed + batch):
            loss = sample_loss(model, train, first, 1) / batch
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        consumed += batch
        records.append(
            {
                "global_batch_size": batch,
                "consumed_samples": consumed,
                "consumed_tokens": consumed * SEQ,
                "learning_rate": ramp_lr(consumed),  # the logged rate is the next iteration's
                "lm_loss": total,
            }
        )
    return records, {name: value.detach() for name, value in model.state_dict().items()}


def saved_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The plain GPT's weights from the rank file's `module` (Megatron's nesting)."""
    module = torch.load(folder / "mp_rank_00_model_states.pt", weights_only=False)["module"]
    return megatron_flat(module)


def saved_progress(folder: Path) -> dict:
    meta = json.loads((folder / "meta.json").read_text())
    names = ("iteration", "consumed_train_samples", "consumed_train_tokens", "lr_samples")
    return {name: meta[name] for name in (*names, "skipped_iterations", "nan_iterations")}


@pytest.fixture(scope="module")
def ramp_run(runs, shared_data, data_cache, tmp_path_factory) -> Path:
    """One process, fp32, checkpoints at iterations 10 (mid-ramp, batch 6), 20 and 21."""
    out = tmp_path_factory.mktemp("ramp")
    flags = [*RAMP_FLAGS, *runs.data_flags(shared_data, data_cache), "--output-dir", str(out)]
    result = runs.train([*flags, "--save", str(out / "ckpt"), "--save-interval", "10"])
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_rampup_equals_a_plain_pytorch_loop(runs, ramp_run, shared_data, data_cache):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 146 one-sample steps: on a busy 2-core machine threads only wait
    try:
        expected, weights = plain_pytorch_ramp(shared_data, data_cache)
    finally:
        torch.set_num_threads(threads)
    records = runs.train_records(ramp_run)
    # Megatron's update_train_iters: 15 ramp iterations to 74 samples, then (150 - 74) // 12.
    assert len(expected) == 21 and [r["iteration"] for r in records] == list(range(1, 22))
    assert [r["global_batch_size"] for r in records] == [2] * 6 + [4] * 3 + [6] * 2 + [
        8, 8, 10, 12, 12, 12, 12, 12, 12, 12,
    ]  # fmt: skip
    for ours, theirs in zip(records, expected, strict=True):
        iteration = ours["iteration"]
        assert ours["skipped_iterations"] == 0, iteration
        for key in ("global_batch_size", "consumed_samples", "consumed_tokens"):
            assert ours[key] == theirs[key], (iteration, key)
        assert ours["learning_rate"] == pytest.approx(theirs["learning_rate"], rel=1e-12)
        assert ours["lm_loss"] == pytest.approx(theirs["lm_loss"], rel=1e-5), iteration
    final = ramp_run / "ckpt" / "global_step21"
    for name, value in saved_weights(final).items():
        torch.testing.assert_close(value, weights[name], rtol=0, atol=5e-5, msg=name)
    assert saved_progress(final) == {
        "iteration": 21,
        "consumed_train_samples": 146,
        "consumed_train_tokens": 146 * SEQ,
        "lr_samples": 146,  # every step applied: the schedule counted every sample
        "skipped_iterations": 0,
        "nan_iterations": 0,
    }


def test_resume_mid_ramp_continues_exactly(runs, ramp_run, shared_data, data_cache, tmp_path):
    """From the checkpoint of iteration 10 (batch 6, the engine built at the ramp's start of 2)
    the run goes on as the uninterrupted one did: the same records, weights and meta.json."""
    save = tmp_path / "ckpt"
    save.mkdir()
    shutil.copytree(ramp_run / "ckpt" / "global_step10", save / "global_step10")
    (save / "latest").write_text("global_step10")
    flags = [*RAMP_FLAGS, *runs.data_flags(shared_data, data_cache), "--output-dir", str(tmp_path)]
    result = runs.train([*flags, "--load", str(save), "--save", str(save)])
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = {r["iteration"]: r for r in runs.train_records(tmp_path)}
    whole = {r["iteration"]: r for r in runs.train_records(ramp_run)}
    assert sorted(resumed) == list(range(11, 22))
    for iteration, record in resumed.items():
        for key in (*PROGRESS, "global_batch_size", "skipped_iterations"):
            assert record[key] == whole[iteration][key], (iteration, key)
    final, reference = save / "global_step21", ramp_run / "ckpt" / "global_step21"
    assert saved_progress(final) == saved_progress(reference)
    ours, theirs = saved_weights(final), saved_weights(reference)
    assert all(torch.equal(ours[name], theirs[name]) for name in theirs)


@pytest.mark.multiprocess
def test_rampup_under_data_parallel_zero2(runs, ramp_run, shared_data, data_cache, tmp_path):
    """DP=2 with ZeRO-2 (gradients reduced into partitions at each accumulation boundary): the
    accumulation steps go 1..6 and every iteration steps, as the one-process run."""
    flags = [*RAMP_FLAGS, *runs.data_flags(shared_data, data_cache), "--output-dir", str(tmp_path)]
    result = runs.train([*flags, "--zero-stage", "2"], nproc=2)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ours = runs.train_records(tmp_path)
    reference = runs.train_records(ramp_run)
    assert [r["global_batch_size"] for r in ours] == [r["global_batch_size"] for r in reference]
    for record, expected in zip(ours, reference, strict=True):
        assert record["skipped_iterations"] == 0, record["iteration"]
        assert record["lm_loss"] == pytest.approx(expected["lm_loss"], rel=2e-5)
