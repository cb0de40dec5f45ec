"""Bad input: one line naming what is wrong, exit 1, and nothing left under the target name."""

import shutil
from pathlib import Path

import pytest
import torch
from mds_checkpoint.cli import main


def run(capsys, *args) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("mds-merge-mp: error: "), captured.err
    return exit_info.value.code, lines[0][len("mds-merge-mp: error: ") :]


@pytest.fixture
def copy(tp2pp2_checkpoint, tmp_path):
    target = tmp_path / "source"
    shutil.copytree(tp2pp2_checkpoint, target)
    return target


def _fails(capsys, tmp_path, *args):
    out = tmp_path / "out"
    code, message = run(capsys, "--save", out, *args)
    assert code == 1
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("out")) == []
    return message


def test_a_folder_that_is_not_a_checkpoint(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    message = _fails(capsys, tmp_path, "--load", tmp_path / "empty")
    assert message.startswith(f"{tmp_path / 'empty'}: not a checkpoint")


def test_an_empty_latest(capsys, tmp_path):
    (tmp_path / "ckpt" / "global_step3").mkdir(parents=True)
    (tmp_path / "ckpt" / "latest").write_text("")
    message = _fails(capsys, tmp_path, "--load", tmp_path / "ckpt")
    assert message == (
        f"{tmp_path / 'ckpt' / 'latest'}: is empty; write the name of a checkpoint folder into it "
        "(the newest is global_step3), or give that folder itself"
    )


def test_missing_rank_files(capsys, tmp_path, copy):
    (copy / "global_step2" / "layer_05-model_01-model_states.pt").unlink()
    message = _fails(capsys, tmp_path, "--load", copy)
    assert (
        message == f"{copy / 'global_step2'}: missing rank files: layer_05-model_01-model_states.pt"
    )


def test_targets_that_do_not_divide(capsys, tmp_path, tp2pp2_checkpoint):
    message = _fails(
        capsys, tmp_path, "--load", tp2pp2_checkpoint, "--target-tensor-model-parallel-size", "8"
    )
    assert "num_attention_heads (4) must be divisible by tensor_model_parallel_size (8)" in message
    message = _fails(
        capsys, tmp_path, "--load", tp2pp2_checkpoint, "--target-pipeline-model-parallel-size", "3"
    )
    assert message == (
        "--target-pipeline-model-parallel-size 3 does not divide num_layers (4) into equal stages"
    )


def test_every_checked_shape_flag_is_checked(capsys, tmp_path, tp2pp2_checkpoint):
    """merge takes the GPT shape flags mds-generate checks (mds_checkpoint.flags'
    CheckedShapeFlags), --ffn-hidden-size too: it was an unknown flag (exit 2) before."""
    message = _fails(capsys, tmp_path, "--load", tp2pp2_checkpoint, "--ffn-hidden-size", "999")
    assert message.startswith("--ffn-hidden-size 999, but the checkpoint's model has 256;")


def _tamper(path, key, value):
    state = torch.load(path)
    state[key] = value
    torch.save(state, path)


def test_shapes_that_disagree_across_ranks(capsys, tmp_path, copy):
    path = copy / "global_step2" / "layer_03-model_01-model_states.pt"  # layer 1
    _tamper(path, "mlp.dense_h_to_4h.weight", torch.zeros(100, 64, dtype=torch.bfloat16))
    message = _fails(capsys, tmp_path, "--load", copy)
    assert "layers.1.mlp.dense_h_to_4h.weight has shape (100, 64) on TP rank 1 but (128, 64)" in (
        message
    )


def test_replicated_copies_that_differ(capsys, tmp_path, copy):
    path = copy / "global_step2" / "layer_05-model_01-model_states.pt"  # layer 3
    _tamper(path, "input_layernorm.weight", torch.full((64,), 2.0, dtype=torch.bfloat16))
    message = _fails(capsys, tmp_path, "--load", copy)
    assert "layers.3.input_layernorm.weight is replicated but TP rank 1's copy differs" in message


def test_an_existing_foreign_save_folder_is_kept(capsys, tmp_path, tp2pp2_checkpoint):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, message = run(capsys, "--load", tp2pp2_checkpoint, "--save", out)
    assert code == 1 and "was not written by mds-merge-mp" in message
    assert (out / "notes.txt").read_text() == "mine"


def test_optimizer_state_that_is_not_there(capsys, tmp_path, tp2pp2_checkpoint):
    reshaped = tmp_path / "weights-only"
    code, _ = _exit(capsys, "--load", tp2pp2_checkpoint, "--save", reshaped)
    assert code == 0
    message = _fails(capsys, tmp_path, "--load", reshaped, "--with-optimizer")
    assert "holds no optimizer state" in message


@pytest.mark.multiprocess  # its fixtures train (getfixturevalue: not marked by name)
@pytest.mark.parametrize(
    ("checkpoint", "name"),
    [
        ("resumed_dp2", "zero_pp_rank_0_mp_rank_00_optim_states.pt"),  # ZeRO-1 at DP=2
        ("resumed_dp2", "zero_pp_rank_1_mp_rank_00_optim_states.pt"),  # the last DP rank
        ("tp2pp2_checkpoint", "bf16_zero_pp_rank_0_mp_rank_01_optim_states.pt"),  # BF16's, MP 1
    ],
)
def test_a_missing_optimizer_partition_is_named(capsys, tmp_path, request, checkpoint, name):
    """--with-optimizer names the partition file that is gone (the DP size is the one the
    present files were saved at), never a rank whose file is there."""
    saved = request.getfixturevalue(checkpoint)
    source = tmp_path / "source"
    shutil.copytree(saved / "ckpt" if checkpoint == "resumed_dp2" else saved, source)
    folder = source / (source / "latest").read_text().strip()
    (folder / name).unlink()
    message = _fails(capsys, tmp_path, "--load", source, "--with-optimizer")
    dp, mp = (2, 1) if checkpoint == "resumed_dp2" else (1, 4)
    sizes = f"{dp} data-parallel x {mp} model-parallel"
    assert message == (
        f"{folder}: missing rank files: {name}, of the optimizer state's {sizes} partitions; "
        "copy the whole checkpoint folder again, or reshape without --with-optimizer"
    )


def test_a_missing_zero3_partition_is_named(capsys, tmp_path, zero3_checkpoint):
    """ZeRO-3's weights live in its partition files: the last DP rank's missing is named (the
    DP size is the one the files were saved at, not the count found, which gave "hold N values
    per rank, the parameter shapes need M")."""
    source = tmp_path / "source"
    shutil.copytree(zero3_checkpoint, source)
    folder = source / (source / "latest").read_text().strip()
    name = "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    (folder / name).unlink()
    message = _fails(capsys, tmp_path, "--load", source)
    assert message == f"{folder}: missing rank files: {name}"


def _exit(capsys, *args):
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    return exit_info.value.code, capsys.readouterr()


def test_a_damaged_pt_file(capsys, tmp_path, copy):
    layer = copy / "global_step2" / "layer_03-model_00-model_states.pt"
    layer.write_bytes(layer.read_bytes()[:-100])  # the zip's central directory cut off
    message = _fails(capsys, tmp_path, "--load", copy)
    assert message.startswith(f"{layer}: not a readable torch checkpoint file (")


def test_import_hf_of_damaged_safetensors(capsys, tmp_path, tp2pp2_checkpoint):
    exported = tmp_path / "hf"
    with pytest.raises(SystemExit, match="0"):
        main(["export-hf", "--load", str(tp2pp2_checkpoint), "--save", str(exported)])
    capsys.readouterr()
    weights = exported / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])
    with pytest.raises(SystemExit, match="1"):
        main(["import-hf", "--load", str(exported), "--save", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"mds-merge-mp import-hf: error: {weights}: transformer.wte.weight's")
    assert line.endswith("do not fit its shape or file")


def test_export_hf_onto_a_full_disk(capsys, tmp_path, tp2pp2_checkpoint, monkeypatch):
    """safetensors reports a full disk as its own error, 37 lines of traceback before. Here it
    writes part of the file and fails as it did on a full 1 MiB tmpfs (the file is written under
    a name of its own and renamed, so /dev/full cannot stand in for the disk)."""
    import safetensors.torch
    from safetensors import SafetensorError

    def onto_full_disk(tensors, filename, metadata=None):  # noqa: ARG001
        Path(filename).write_bytes(b"\0" * 4096)
        raise SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        )

    monkeypatch.setattr(safetensors.torch, "save_file", onto_full_disk)
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match="1"):
        main(["export-hf", "--load", str(tp2pp2_checkpoint), "--save", str(out)])
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(
        f"mds-merge-mp export-hf: error: writing {out}: No space left on device ("
    )
    assert line.endswith("free there); free some space there or give --save another folder")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("out")) == []


def test_a_reshape_onto_a_full_disk(capsys, tmp_path, tp2pp2_checkpoint, monkeypatch):
    """ptfile's writes go to /dev/full (ENOSPC on every write): before, `[Errno 28] No space
    left on device`, no folder named."""
    from mds_checkpoint.ptfile import write

    monkeypatch.setattr(write, "open", lambda path, mode: open("/dev/full", mode), raising=False)
    out = tmp_path / "out"
    code, message = run(capsys, "--load", tp2pp2_checkpoint, "--save", out)
    assert code == 1
    assert message.startswith(f"writing {out}: No space left on device (")
    assert message.endswith(" free there); free some space there or give --save another folder")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("out")) == []
