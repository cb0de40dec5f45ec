"""mds-train reads the checkpoints it wrote before it took upstream's layout, and resumes them
exactly.

Until session 8 mds-train's plain engine saved `module` with the plain GPT's flat names
(`layers.0.input_layernorm.weight`) and its pipeline numbered the layer files as bigscience's
fork does (`01` embedding, `03..N+2` layers, `N+4` final norm), with no `lr_scheduler` or
`rng_state` of upstream's. It now writes deepspeedai/Megatron-DeepSpeed's (Megatron's nesting
under `module`, layers `02..N+1`, norm `N+2`). Each test rewrites a checkpoint of today's run into
the earlier layout (what the earlier writer produced: same tensors, flat names, bigscience's
numbering) and resumes from it: the losses must be the uninterrupted run's, bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mds_checkpoint.engine_names import megatron_flat


def _flags(runs, shared_data, data_cache, out: Path, *extra: str) -> list[str]:
    return [
        *runs.MODEL,
        *runs.OPTIMIZER,
        *runs.NO_DROPOUT,
        *runs.data_flags(shared_data, data_cache),
        *"--train-iters 8 --log-interval 1 --eval-iters 0 --save-interval 4".split(),
        "--output-dir",
        str(out),
        *extra,
    ]


def _as_earlier_plain_engine(folder: Path) -> None:
    for path in folder.glob("mp_rank_*_model_states.pt"):
        state = torch.load(path, weights_only=False)
        assert "language_model" in state["module"]
        state["module"] = megatron_flat(state["module"])
        state["lr_scheduler"] = None
        del state["rng_state"]
        torch.save(state, path)


def _as_earlier_pipeline(folder: Path, num_layers: int) -> None:
    """deepspeedai's numbering (layers 2..N+1, norm N+2) -> bigscience's (3..N+2, N+4)."""
    renames = {num_layers + 2: num_layers + 4}
    renames.update({index: index + 1 for index in range(num_layers + 1, 1, -1)})
    for old, new in renames.items():  # from the highest index down: no name is taken twice
        for path in sorted(folder.glob(f"layer_{old:02d}-model_*-model_states.pt")):
            path.rename(path.with_name(path.name.replace(f"layer_{old:02d}-", f"layer_{new:02d}-")))
    for path in folder.glob("mp_rank_*_model_states.pt"):
        state = torch.load(path, weights_only=False)
        state["lr_scheduler"] = None
        del state["rng_state"]
        torch.save(state, path)


def _resume_from_earlier_layout(runs, shared_data, data_cache, tmp_path, rewrite, *extra, nproc):
    whole, save = tmp_path / "whole", tmp_path / "ckpt"
    result = runs.train(
        _flags(runs, shared_data, data_cache, whole, "--save", str(save), *extra), nproc=nproc
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rewrite(save / "global_step4")
    resumed = tmp_path / "resumed"
    result = runs.train(
        _flags(
            runs, shared_data, data_cache, resumed, "--load", str(save / "global_step4"),
            "--save", str(tmp_path / "ckpt2"), *extra,
        ),
        nproc=nproc,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    ours, reference = runs.losses(resumed), runs.losses(whole)
    assert sorted(ours) == [5, 6, 7, 8]
    assert [ours[i] for i in range(5, 9)] == [reference[i] for i in range(5, 9)]


def test_a_plain_engine_checkpoint_with_flat_names_resumes(runs, shared_data, data_cache, tmp_path):
    _resume_from_earlier_layout(
        runs, shared_data, data_cache, tmp_path, _as_earlier_plain_engine, nproc=1
    )


@pytest.mark.multiprocess
def test_a_pipeline_checkpoint_in_bigscience_s_numbering_resumes(
    runs, shared_data, data_cache, tmp_path
):
    _resume_from_earlier_layout(
        runs, shared_data, data_cache, tmp_path,
        lambda folder: _as_earlier_pipeline(folder, num_layers=2),
        "--pipeline-model-parallel-size", "2", nproc=2,
    )  # fmt: skip
