"""benchmarks/fp8_curve_cpu.py: bf16 and FP8 (mds_model.fp8 through torch._scaled_mm on the CPU)
trained from the same weights on the same samples, at a size CI runs in seconds."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "benchmarks/fp8_curve_cpu.py"
TINY = dict(layers=1, hidden=32, heads=2, kv_heads=1, ffn=64, seq_length=16, micro_batch=2)


def load_script():
    spec = importlib.util.spec_from_file_location("fp8_curve_cpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fp8_follows_bf16_from_the_same_start_without_equalling_it():
    script = load_script()
    tokens = torch.randint(0, 64, (2000,), generator=torch.Generator().manual_seed(0))
    args = SimpleNamespace(**TINY, vocab=64, lr=1e-3, iterations=20)
    bf16 = script.train(args, "bf16", 1, tokens)
    assert len(bf16) == 2 and bf16 == script.train(args, "bf16", 1, tokens)  # deterministic
    for variant in ("fp8", "fp8-margin"):
        fp8 = script.train(args, variant, 1, tokens)
        assert fp8 != bf16  # the linears ran in FP8
        for ours, theirs in zip(fp8, bf16, strict=True):
            assert abs(ours - theirs) / theirs < 0.02


def test_the_script_prints_each_variant_against_bf16(shared_data):
    flags = [f"--{name.replace('_', '-')}={value}" for name, value in TINY.items()]
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--data-path", str(shared_data / "megatron-golden" /
         "meg-gpt2-openwebtext_text_document"), *flags, "--tokens", "3000",
         "--iterations", "10", "--seeds", "1", "--variants", "bf16,fp8-history"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "3,000 tokens read 0.1 times in 10 iterations" in result.stdout
    assert "seed 1: bf16 final" in result.stdout
    assert "  fp8-history: final" in result.stdout


def test_unknown_variants_are_one_line():
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--data-path", "x", "--variants", "bf16,fp9"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--variants: give bf16 and any of fp8, fp8-history" in result.stderr
