"""benchmarks/reference_profile.py: the reference's own set-up and step, run under mds-train's
profiler hooks, give a trace host_profile.py reads. reference_gpt.py needs CUDA, so a CPU
stand-in of its layout (argparse, module-level set-up, `def one()`, then its own timing loop)
plays it here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "benchmarks/reference_profile.py"

STAND_IN = """
import argparse, sys, torch
print("argv", " ".join(sys.argv[1:]))
p = argparse.ArgumentParser()
for name in ("--layers", "--hidden", "--heads", "--seq", "--mbs"):
    p.add_argument(name, type=int)
p.add_argument("--compile", action="store_true")
a = p.parse_args()
m = torch.nn.Linear(a.hidden, a.hidden)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
x = torch.randn(a.mbs, a.seq, a.hidden)
def one():
    loss = m(x).square().mean()
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
raise SystemExit("the reference's own timing loop ran")
"""


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300
    )


def test_the_references_step_is_traced(host_profile, tmp_path):
    reference = tmp_path / "reference_gpt.py"
    reference.write_text(STAND_IN)
    folder = tmp_path / "tb"
    result = run(
        *("--reference", str(reference), "--tensorboard-dir", str(folder), "--shape", "tiny"),
        *("--profile_steps", "3,4"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # benchmarks/train.py's reference command line at --tiny's shape and micro-batch.
    assert "argv --compile --mbs 2 --seq 64 --layers 2 --hidden 64 --heads 4" in result.stdout
    (trace,) = host_profile.trace_files([folder])
    assert str(trace) in result.stdout.splitlines()
    steps = host_profile.summarise(host_profile.load_trace(trace))
    assert [step.name for step in steps] == ["ProfilerStep#0", "ProfilerStep#1"]
    for step in steps:  # one forward, backward and SGD step each
        assert step.calls["aten::linear"] == 1 and step.calls["Optimizer.step#SGD.step"] == 1


def test_a_file_without_the_step_is_one_line(tmp_path):
    reference = tmp_path / "other.py"
    reference.write_text("print('no step here')\n")
    result = run("--reference", str(reference), "--tensorboard-dir", str(tmp_path / "tb"))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"reference_profile.py: error: {reference}: no top-level `def one()` "
        "(reference_gpt.py's training step) to profile"
    ]
    assert not (tmp_path / "tb").exists()
