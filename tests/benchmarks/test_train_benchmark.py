"""benchmarks/train.py's FP8 comparison: speed against our bf16 step, MFU on both ceilings, and the
loss curves' largest difference of 10-iteration means, from the interval lines a run logs; its
--tiny smoke run of every ZeRO variant, to the default's losses; --scaling's one-GPU and DP = N
runs and their ratio."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def load_benchmark():
    spec = importlib.util.spec_from_file_location(
        "train_benchmark", REPO_ROOT / "benchmarks/train.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fp8_is_compared_with_the_bf16_run(capsys):
    benchmark = load_benchmark()
    # Losses logged every 5 iterations (each line its interval's mean) over 30 iterations.
    bf16 = {5: 10.0, 10: 9.0, 15: 8.0, 20: 8.0, 25: 7.0, 30: 7.0}
    fp8 = {5: 11.0, 10: 9.0, 15: 8.2, 20: 8.2, 25: 7.0, 30: 7.07}
    results = {
        "default": {"tokens_per_second": 1000.0, "mfu": 0.5, "losses": bf16},
        "fp8": {"tokens_per_second": 1250.0, "mfu": 0.625, "losses": fp8},
    }
    args = SimpleNamespace(peak_tflops=790.0, fp8_peak_tflops=1979.0)
    benchmark.compare_fp8(args, results)
    out = capsys.readouterr().out
    assert "mds-train fp8: 1.250x mds-train default (bf16)" in out
    assert "62.5% of the bf16 ceiling (790 TFLOP/s), 24.9% of the FP8 ceiling (1979)" in out
    # Iterations 1-10 (the 11.0 against 10.0) are left out; 11-20: 8.2 vs 8.0 is 2.50%.
    assert "10-iteration means after iteration 10: 2.50%" in out
    assert "eager against default" not in out  # no second bf16 run to measure the spread with


def test_fp8_s_curve_measure_is_also_given_for_two_bf16_runs(capsys):
    benchmark = load_benchmark()
    bf16 = {10: 9.0, 20: 8.0, 30: 7.0}
    results = {
        "default": {"tokens_per_second": 1000.0, "mfu": None, "losses": bf16},
        "fp8": {"tokens_per_second": 1250.0, "mfu": None, "losses": {10: 9.0, 20: 8.0, 30: 7.07}},
        "eager": {"tokens_per_second": 990.0, "mfu": None, "losses": {10: 9.5, 20: 8.04, 30: 7.0}},
    }
    benchmark.compare_fp8(SimpleNamespace(peak_tflops=790.0, fp8_peak_tflops=1979.0), results)
    out = capsys.readouterr().out
    # fp8: 1.00% at 21-30; eager: 0.50% at 11-20 (its 9.5 at 1-10 is left out, as FP8's would be)
    assert "10-iteration means after iteration 10: 1.00%" in out
    assert (
        "mds-train eager against default (both bf16): largest relative difference of "
        "10-iteration means after iteration 10: 0.50%"
    ) in out


def test_seeds_compare_mean_curves_and_pair_each_seed_s_runs(capsys):
    """With --seeds, a variant's curve is its seeds' mean, and each seed's FP8 run is paired with
    the bf16 run of that seed (the same tokens), not with whichever ran at the same position."""
    benchmark = load_benchmark()

    def run(seed, losses, tokens_per_second=100.0):
        return dict(seed=seed, losses=losses, tokens_per_second=tokens_per_second, ms=1.0, mfu=None)

    bf16 = [run(1, {10: 9.0, 20: 8.0}), run(2, {10: 9.0, 20: 6.0})]
    fp8 = [run(2, {10: 9.0, 20: 6.3}, 130.0), run(1, {10: 9.0, 20: 8.0}, 120.0)]
    results = {"default": benchmark.over_seeds(bf16), "fp8": benchmark.over_seeds(fp8)}
    assert results["default"]["losses"] == {10: 9.0, 20: 7.0}
    assert results["fp8"]["tokens_per_second"] == 125.0  # the seeds' median
    benchmark.compare_fp8(SimpleNamespace(peak_tflops=790.0, fp8_peak_tflops=1979.0), results)
    out = capsys.readouterr().out
    # Mean curves: 7.15 against 7.0 at 11-20 is 2.14%; by seed: seed 2 +5.00%, seed 1 0%.
    assert "10-iteration means after iteration 10: 2.14%" in out
    assert "each seed's own pair: 5.00%, 0.00%" in out
    assert "(iterations 11-20): +2.50% +- 2.50% (standard error)" in out


def test_cpus_are_read_as_taskset_reads_them():
    benchmark = load_benchmark()
    assert benchmark.parse_cpus("0,1") == {0, 1}
    assert benchmark.parse_cpus("0-3,8") == {0, 1, 2, 3, 8}
    for bad in ("", "a", "3-1", "0,,1", "-2"):
        with pytest.raises(ValueError, match="give core numbers and ranges"):
            benchmark.parse_cpus(bad)


def test_profile_dir_gives_each_variant_its_own_trace_folder(tmp_path):
    benchmark = load_benchmark()
    args = SimpleNamespace(profile_dir=None, profile_steps="21,30")
    assert benchmark.profile_flags(args, "default") == []
    args.profile_dir = tmp_path
    traces = str(tmp_path / "eager")
    assert benchmark.profile_flags(args, "eager") == [
        "--profile", "pt", "--profile_steps", "21,30", "--tensorboard-dir", traces,
    ]  # fmt: skip


def test_a_llama_shape_runs_upstream_s_llama_flags_against_reference_llama(tmp_path, capsys):
    """Both sides at the same Llama shape: mds-train with upstream's Llama flag block and the
    shape's key/value heads and ffn; reference_llama.py with the same sizes, theta and GPT-2's
    padded vocabulary."""
    benchmark = load_benchmark()
    stand_in = tmp_path / "reference_llama.py"
    stand_in.write_text("import sys\nprint('argv', *sys.argv[1:])\nprint('tok/s=1,234')\n")
    args = SimpleNamespace(
        shape_name="llama3-1b",
        shape=benchmark.SHAPES["llama3-1b"],
        reference=stand_in,
        micro_batch=4,
        peak_tflops=790.0,
    )
    assert benchmark.run_reference(args) == 1234.0
    reference_argv = capsys.readouterr().out
    assert "--layers 16 --hidden 2048 --heads 32 --preset llama3-1b --kv-heads 8" in reference_argv
    assert "--ffn 8192 --theta 500000 --vocab 50304" in reference_argv
    argv = " ".join(
        benchmark.train_command(
            SimpleNamespace(
                **vars(args),
                iterations=30,
                log_interval=5,
                data_path="d",
                vocab_file="v",
                merge_file="m",
                tp=1,
                pp=1,
                nproc=1,
                global_batch=None,
                lr_warmup_iters=2,
                seed=7,
            ),
            tmp_path / "out",
            0,
            None,
            [],
        )
    )
    for flags in (
        "--swiglu --normalization rmsnorm --disable-bias-linear",
        "--untie-embeddings-and-output-weights --use-rotary-position-embeddings",
        "--rotary-position-embeddings-theta 500000",
        "--num-layers 16 --hidden-size 2048 --num-attention-heads 32 --seq-length 2048",
        "--num-key-value-heads 8 --ffn-hidden-size 8192 --micro-batch-size 4",
        "--lr-warmup-iters 2",
        "--seed 7",
    ):
        assert flags in argv


def _tiny(shared_data, *flags: str):
    import subprocess
    import sys

    golden = shared_data / "megatron-golden"
    return subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "benchmarks/train.py"),
            "--tiny",
            *("--data-path", str(golden / "meg-gpt2-openwebtext_text_document")),
            *("--vocab-file", str(golden / "gpt2-tiny-vocab.json")),
            *("--merge-file", str(golden / "gpt2-tiny-merges.txt")),
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )


# DeepSpeed's ZeRO-3 optimizer clips and steps in its own order (1.8e-5 seen over --tiny's six
# iterations); mds-train's ZeRO-1/2 give ZeRO-0's losses to the bit on one rank.
ZERO_RTOL = 1e-4


@pytest.mark.multiprocess
def test_tiny_runs_every_zero_variant_to_the_default_losses(shared_data):
    import re

    result = _tiny(shared_data, "--variants", "default,zero1,zero2,zero3")
    assert result.returncode == 0, result.stderr[-3000:]
    found = dict(
        re.findall(r"mds-train (zero\d): losses against default's: largest relative difference "
                   r"(\S+) over 6 logged iterations", result.stdout)
    )  # fmt: skip
    assert sorted(found) == ["zero1", "zero2", "zero3"], result.stdout[-2000:]
    assert float(found["zero1"]) == float(found["zero2"]) == 0.0
    assert float(found["zero3"]) < ZERO_RTOL


@pytest.mark.multiprocess
def test_scaling_runs_each_variant_on_one_gpu_and_on_n(shared_data):
    """--scaling: the one-process run just before the DP = 2 one, each with its line, then the
    ratio of their tokens/s (on a CPU it checks the script, not the speed)."""
    import re

    result = _tiny(shared_data, "--variants", "zero1", "--nproc", "2", "--scaling")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("mds-train zero1")]
    assert [line.split(",")[0] for line in lines[:2]] == [
        "mds-train zero1 (nproc 1",
        "mds-train zero1 (nproc 2",
    ], result.stdout[-2000:]
    rate = [
        float(re.search(r": ([\d,]+) tokens/s", line)[1].replace(",", "")) for line in lines[:2]
    ]
    ratio = re.fullmatch(r"mds-train zero1: DP = 2 at (\S+)x one GPU's tokens/s .*", lines[2])
    assert ratio is not None, lines[2]
    assert float(ratio[1]) == pytest.approx(rate[1] / rate[0], abs=1e-3 + rate[1] / rate[0] * 1e-3)


@pytest.mark.parametrize(
    "flags",
    [["--nproc", "1"], ["--nproc", "2", "--tp", "2"], ["--nproc", "2", "--global-batch", "5"]],
)
def test_scaling_is_refused_where_it_compares_nothing(shared_data, flags):
    result = _tiny(shared_data, "--scaling", *flags)
    assert result.returncode == 2
    assert "--scaling" in result.stderr.strip().splitlines()[-1]


def test_corpus_passes_count_the_tokens_the_recorded_batches_read(shared_data):
    """The 1B runs' 300 iterations of 4 x 2048 tokens against the shared corpus's 1,361,845."""
    benchmark = load_benchmark()
    args = SimpleNamespace(
        data_path=str(shared_data / "megatron-golden/meg-gpt2-openwebtext_text_document"),
        iterations=300,
        shape=benchmark.SHAPES["llama3-1b"],
    )
    assert benchmark.corpus_passes(args, 4) == 300 * 4 * 2048 / 1_361_845


def test_losses_json_keeps_each_run_s_seed_for_loss_curves(tmp_path):
    benchmark = load_benchmark()
    path = tmp_path / "losses.json"
    runs = {"default": [dict(seed=2, losses={10: 9.0}, tokens_per_second=1.0)]}
    benchmark.save_losses(SimpleNamespace(losses_json=path), runs)
    assert json.loads(path.read_text()) == {"default": [{"seed": 2, "losses": {"10": 9.0}}]}
