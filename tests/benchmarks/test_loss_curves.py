"""benchmarks/loss_curves.py: the --losses-json files of several calls compared as one, a seed's
runs of one variant averaged, a repeated variant compared with itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "benchmarks/loss_curves.py"


def write(path: Path, variants: dict) -> Path:
    path.write_text(json.dumps(variants))
    return path


def run(*files: Path, base: str = "default") -> subprocess.CompletedProcess:
    command = [sys.executable, str(SCRIPT), *map(str, files), "--base", base]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def curve(losses: dict[int, float]) -> dict[str, float]:
    return {str(i): loss for i, loss in losses.items()}  # as json writes int keys


def test_calls_are_pooled_by_seed_and_a_repeated_variant_is_set_against_itself(tmp_path):
    first = write(
        tmp_path / "first.json",
        {
            "default": [
                {"seed": 1, "losses": curve({10: 9.0, 20: 8.0})},
                {"seed": 2, "losses": curve({10: 9.0, 20: 6.0})},
            ],
            "fp8": [
                {"seed": 2, "losses": curve({10: 9.0, 20: 6.3})},
                {"seed": 1, "losses": curve({10: 9.0, 20: 8.2})},
            ],
        },
    )
    second = write(
        tmp_path / "second.json",
        {
            "default": [
                {"seed": 1, "losses": curve({10: 9.0, 20: 8.4})},
                {"seed": 2, "losses": curve({10: 9.0, 20: 6.0})},
            ]
        },
    )
    result = run(first, second)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    # default's two runs: seed 1 8.4 against 8.0 (+5.00%), seed 2 equal; mean 7.2 against 7.0.
    assert "default (second runs) against default (first runs) at seeds 1, 2" in out
    assert "after iteration 10: 2.86%" in out
    assert "each seed's own pair: 5.00%, 0.00%" in out
    # fp8 against the pooled default: seed 1 8.2 against (8.0 + 8.4) / 2, seed 2 6.3 against 6.0;
    # the mean curves 7.25 against 7.1 at 11-20: 2.11%.
    assert "fp8 against default at seeds 2, 1" in out
    assert "after iteration 10: 2.11%" in out
    assert "each seed's own pair: 5.00%, 0.00%" in out.split("fp8 against default")[1]
    assert "(iterations 11-20): +2.50% +- 2.50% (standard error)" in out


def test_a_file_without_seeds_is_refused_in_one_line(tmp_path):
    old = write(tmp_path / "old.json", {"default": [curve({10: 9.0, 20: 8.0})]})
    result = run(old)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "old.json: default's runs carry no seeds" in lines[0]


def test_a_base_no_file_has_is_named_with_the_ones_there_are(tmp_path):
    losses = write(tmp_path / "l.json", {"fp8": [{"seed": 1, "losses": curve({10: 9.0})}]})
    result = run(losses, base="default")
    assert result.returncode != 0
    assert "no default runs in" in result.stderr and "--base one of fp8" in result.stderr
