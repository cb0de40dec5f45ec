"""A model with one more 2-D weight than GPT-2 (`mlp.extra.weight`, tests/train/extra_weight.py:
one row of mds_model's parameter table and one module attribute, no other change) keeps each Adam
moment on its own parameter through `mds-merge-mp --with-optimizer` and a resume: the resumed
run's losses are the uninterrupted run's. mds-train's decay groups and mds-merge-mp's reading of
the optimizer's order both come from the table; before, train decayed by `dim() >= 2` and
mds-merge-mp by name patterns (`query_key_value`, `.dense`), which filed this weight differently
and gave its moments to other parameters."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PLUGIN = Path(__file__).with_name("extra_weight.py")
RTOL = 1e-6  # as the universal-checkpoint resume tests: fp32, one process, the same sums


def _run(runs, tool: str, *args) -> subprocess.CompletedProcess:
    command = [sys.executable, str(PLUGIN), tool, *map(str, args)]
    result = subprocess.run(
        command, env=runs._environment(), capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _flags(runs, shared_data, data_cache, out: Path, *extra) -> list[str]:
    return runs.checkpoint_test_flags(shared_data, data_cache, out, "--train-iters", 4, *extra)


def test_a_new_weight_keeps_its_adam_moments_through_merge_mp_and_a_resume(
    runs, shared_data, data_cache, tmp_path
):
    # The uninterrupted run saves at 2 and 4: the saved run is its own reference.
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    save = ["--save", whole / "checkpoints", "--save-interval", 2]
    _run(runs, "mds-train", *_flags(runs, shared_data, data_cache, whole, *save))
    universal = tmp_path / "universal"
    source = whole / "checkpoints" / "global_step2"
    _run(runs, "mds-merge-mp", "--load", source, "--save", universal, "--with-optimizer")
    meta = json.loads((universal / "global_step2" / "meta.json").read_text())
    assert meta["optimizer"]["layout"] == "universal"
    extra = universal / "global_step2" / "zero" / "language_model.encoder.layers.1.mlp.extra.weight"
    assert sorted(p.name for p in extra.iterdir())[:3] == ["exp_avg.pt", "exp_avg_sq.pt", "fp32.pt"]
    load = ["--load", universal]
    _run(runs, "mds-train", *_flags(runs, shared_data, data_cache, resumed, *load))
    theirs, ours = runs.losses(whole), runs.losses(resumed)
    assert sorted(ours) == [3, 4]
    for iteration, loss in ours.items():
        assert loss == pytest.approx(theirs[iteration], rel=RTOL), iteration
