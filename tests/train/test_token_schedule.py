"""The token schedule (--lr-warmup-tokens, --lr-decay-tokens, --train-tokens) against upstream's
own formula: `OptimizerParamScheduler.get_lr` and `step` of deepspeedai/Megatron-DeepSpeed's
megatron/optimizer_param_scheduler.py (commit 6acc370a) transcribed below, stepped as its
training.py does under DeepSpeed (`engine.step(lr_kwargs={'increment': ...})` reads
`args.consumed_train_tokens` before `train()` adds the iteration's tokens), and a real run whose
metrics.jsonl follows it and which stops where upstream's loop condition does."""

import math

import pytest
from mds_checkpoint.upstream_state import scheduler_state
from mds_train.schedule import LearningRateSchedule, TokenLearningRateSchedule
from mds_train.state import TrainingState


class UpstreamScheduler:
    """OptimizerParamScheduler's learning-rate half, transcribed (get_lr mutates
    lr_warmup_tokens, as upstream's does, when a sample warmup ends before a token decay)."""

    def __init__(self, max_lr, min_lr, lr_warmup_steps, lr_decay_steps, lr_decay_style,
                 lr_warmup_tokens, lr_decay_tokens):  # fmt: skip
        self.max_lr, self.min_lr = float(max_lr), min_lr
        self.lr_warmup_steps, self.lr_decay_steps = lr_warmup_steps, lr_decay_steps
        self.lr_warmup_tokens, self.lr_decay_tokens = lr_warmup_tokens, lr_decay_tokens
        self.lr_decay_style = lr_decay_style
        self.num_steps = self.num_tokens = 0
        self.lr = None
        self.step(0, 0)

    def get_lr(self):
        if self.lr_warmup_tokens is None:
            if self.lr_warmup_steps > 0 and self.num_steps <= self.lr_warmup_steps:
                if self.num_steps == self.lr_warmup_steps and self.lr_decay_tokens is not None:
                    self.lr_warmup_tokens = self.num_tokens
                return self.max_lr * float(self.num_steps) / float(self.lr_warmup_steps)
        else:
            if self.lr_warmup_tokens > 0 and self.num_tokens <= self.lr_warmup_tokens:
                return self.max_lr * float(self.num_tokens) / float(self.lr_warmup_tokens)
        if self.lr_decay_style == "constant":
            return self.max_lr
        if self.lr_decay_tokens is None:
            if self.num_steps > self.lr_decay_steps:
                return self.min_lr
        else:
            if self.num_tokens > self.lr_decay_tokens:
                return self.min_lr
        if self.lr_decay_style == "inverse-square-root":
            if self.lr_warmup_tokens is None:
                warmup_steps = max(self.lr_warmup_steps, 1)
                num_steps = max(self.num_steps, 1)
                lr = self.max_lr * warmup_steps**0.5 / (num_steps**0.5)
            else:
                warmup_tokens = max(self.lr_warmup_tokens, 1)
                num_tokens = max(self.num_tokens, 1)
                lr = self.max_lr * warmup_tokens**0.5 / (num_tokens**0.5)
            return max(self.min_lr, lr)
        if self.lr_decay_tokens is None:
            num_steps_ = self.num_steps - self.lr_warmup_steps
            decay_steps_ = self.lr_decay_steps - self.lr_warmup_steps
            decay_ratio = float(num_steps_) / float(decay_steps_)
        else:
            num_tokens_ = self.num_tokens - self.lr_warmup_tokens
            decay_tokens_ = self.lr_decay_tokens - self.lr_warmup_tokens
            decay_ratio = float(num_tokens_) / float(decay_tokens_)
        assert 0.0 <= decay_ratio <= 1.0
        delta_lr = self.max_lr - self.min_lr
        if self.lr_decay_style == "linear":
            coeff = 1.0 - decay_ratio
        elif self.lr_decay_style == "cosine":
            coeff = 0.5 * (math.cos(math.pi * decay_ratio) + 1.0)
        return self.min_lr + coeff * delta_lr

    def step(self, increment, token_num):
        self.num_tokens = token_num
        self.num_steps += increment
        self.lr = self.get_lr()


GLOBAL_BATCH, SEQ = 8, 64  # 512 tokens an iteration

CASES = {
    # The GPT-3 examples': warmup and decay in tokens.
    "tokens": dict(warmup_samples=0, warmup_tokens=1500, decay_tokens=6000),
    # curriculum_learning/ds_pretrain_gpt2.sh: --lr-warmup-iters with --lr-decay-tokens.
    "iters-then-tokens": dict(
        warmup_samples=3 * GLOBAL_BATCH, warmup_tokens=None, decay_tokens=6000
    ),  # fmt: skip
    # A token warmup before a decay in samples.
    "tokens-then-samples": dict(warmup_samples=0, warmup_tokens=2000, decay_tokens=None),
    # Samples only (the golden's schedule): upstream records no warmup in tokens.
    "samples": dict(warmup_samples=3 * GLOBAL_BATCH, warmup_tokens=None, decay_tokens=None),
}


@pytest.mark.parametrize("style", ["linear", "cosine", "inverse-square-root", "constant"])
@pytest.mark.parametrize("case", CASES)
def test_token_schedule_is_upstream_s_step_by_step(case, style):
    lengths = CASES[case]
    samples = LearningRateSchedule(
        max_lr=5e-3,
        min_lr=5e-4,
        warmup_samples=lengths["warmup_samples"],
        decay_samples=20 * GLOBAL_BATCH,
        decay_style=style,
    )
    ours = TokenLearningRateSchedule(
        samples=samples,
        warmup_tokens=lengths["warmup_tokens"],
        decay_tokens=lengths["decay_tokens"],
    )
    if lengths["warmup_tokens"] is None and lengths["decay_tokens"] is None:
        ours = samples
    # What mds-train's checkpoints record as upstream's `lr_scheduler` (scheduler_record.py).
    record = {"max_lr": 5e-3, "min_lr": 5e-4, "lr_warmup_steps": lengths["warmup_samples"],
              "lr_warmup_tokens": lengths["warmup_tokens"], "lr_decay_steps": 20 * GLOBAL_BATCH,
              "lr_decay_tokens": lengths["decay_tokens"], "lr_decay_style": style,
              "start_wd": 0.1, "end_wd": 0.1, "wd_incr_style": "constant",
              "wd_incr_steps": 24 * GLOBAL_BATCH}  # fmt: skip
    upstream = UpstreamScheduler(5e-3, 5e-4, lengths["warmup_samples"], 20 * GLOBAL_BATCH, style,
                                 lengths["warmup_tokens"], lengths["decay_tokens"])  # fmt: skip
    state = TrainingState()
    assert ours.lr_at(state) == upstream.lr
    for iteration in range(1, 25):
        skipped = iteration == 7  # an fp16 overflow: no scheduler step, tokens still counted
        tokens_before = state.consumed_train_tokens
        state.consumed_train_tokens += GLOBAL_BATCH * SEQ
        if skipped:
            continue
        # mds-train's loop (loop.py) ...
        state.lr_samples += GLOBAL_BATCH
        state.lr_tokens = tokens_before
        if state.lr_samples == ours.warmup_samples:
            state.lr_warmup_end_tokens = state.lr_tokens
        # ... and upstream's, stepped inside DeepSpeed's engine.step before train() counts.
        upstream.step(GLOBAL_BATCH, tokens_before)
        assert ours.lr_at(state) == pytest.approx(upstream.lr, rel=1e-15, abs=0), iteration
        saved = scheduler_state(record, state.to_dict())  # upstream's state_dict now
        for key in ("num_steps", "num_tokens", "lr_warmup_tokens"):
            assert saved[key] == getattr(upstream, key), (iteration, key)


def test_a_token_decay_without_any_warmup_is_refused():
    """Upstream fails there (`num_tokens - None`); mds-train says which flag to give."""
    samples = LearningRateSchedule(
        max_lr=1.0, min_lr=0.0, warmup_samples=0, decay_samples=100, decay_style="cosine"
    )
    with pytest.raises(ValueError, match="give --lr-warmup-tokens"):
        TokenLearningRateSchedule(samples=samples, warmup_tokens=None, decay_tokens=1000)


def test_a_run_follows_the_token_schedule_and_stops_at_train_tokens(
    runs, shared_data, data_cache, tmp_path
):
    """--train-iters 20 --train-tokens 6000 at 512 tokens an iteration: upstream's loop runs
    while consumed tokens < 6000, so 12 iterations; every logged rate is the transcription's."""
    out = tmp_path / "out"
    flags = [
        *runs.MODEL,
        *"--lr 5e-3 --min-lr 5e-4 --lr-decay-style cosine --seed 1234".split(),
        *"--train-iters 20 --train-tokens 6000 --lr-warmup-tokens 1500".split(),
        *"--lr-decay-tokens 4000 --log-interval 1 --eval-interval 100 --eval-iters 1".split(),
        *runs.data_flags(shared_data, data_cache),
        *("--output-dir", str(out)),
    ]
    result = runs.train(flags)
    assert result.returncode == 0, result.stderr[-3000:]
    records = runs.train_records(out)
    assert [r["iteration"] for r in records] == list(range(1, 13))
    assert records[-1]["consumed_tokens"] == 12 * 512
    upstream = UpstreamScheduler(5e-3, 5e-4, 0, 20 * GLOBAL_BATCH, "cosine", 1500, 4000)
    for record in records:
        upstream.step(GLOBAL_BATCH, (record["iteration"] - 1) * 512)
        assert record["learning_rate"] == pytest.approx(upstream.lr, rel=1e-12)
