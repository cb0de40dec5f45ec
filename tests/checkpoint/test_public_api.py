"""mds-checkpoint's public API is what its neighbours import (issue #34): every other package and
script imports it as `from mds_checkpoint import X`, X one of `mds_checkpoint.__all__`, never one of
its submodules; the submodules stay free to change. Only this package's tests and its own
benchmark (which writes a checkpoint with the package's writer) reach inside it."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import mds_checkpoint
import pytest

ROOT = Path(__file__).resolve().parents[2]
NEIGHBOURS = sorted(
    path
    for pattern in ("packages/*/src/**/*.py", "scripts/**/*.py")
    for path in ROOT.glob(pattern)
    if not path.is_relative_to(ROOT / "packages" / "checkpoint")
)


def checkpoint_imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of each import of mds_checkpoint or its submodules in `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [(node.module, [alias.name for alias in node.names])]
        elif isinstance(node, ast.Import):
            modules = [(alias.name, []) for alias in node.names]
        else:
            continue
        for module, names in modules:
            if module.partition(".")[0] == "mds_checkpoint":
                found.append((node.lineno, module, names))
    return found


def test_the_neighbours_are_scanned():
    names = {path.relative_to(ROOT).as_posix() for path in NEIGHBOURS}
    assert "packages/train/src/mds_train/checkpointing.py" in names
    assert "packages/generate/src/mds_generate/loading.py" in names
    assert not any(name.startswith("packages/checkpoint/") for name in names)


def test_other_packages_import_only_the_public_names():
    wrong = []
    for path in NEIGHBOURS:
        for line, module, names in checkpoint_imports(path):
            where = f"{path.relative_to(ROOT)}:{line}"
            if module != "mds_checkpoint":
                wrong.append(f"{where}: {module} (import it from mds_checkpoint)")
            wrong += [
                f"{where}: {name} is not public"
                for name in names
                if name not in mds_checkpoint.__all__
            ]
    assert wrong == []


def test_the_scan_sees_a_submodule_import(tmp_path):
    source = tmp_path / "example.py"
    source.write_text(
        "import mds_checkpoint\n"
        "def f():\n"
        "    from mds_checkpoint.meta import read_meta\n"
        "    from mds_checkpoint import CheckpointMeta, ptfile\n"
    )
    assert checkpoint_imports(source) == [
        (1, "mds_checkpoint", []),
        (3, "mds_checkpoint.meta", ["read_meta"]),
        (4, "mds_checkpoint", ["CheckpointMeta", "ptfile"]),
    ]
    assert "ptfile" not in mds_checkpoint.__all__  # a submodule, not a public name


@pytest.mark.parametrize(
    ("public", "module", "name"),
    [
        ("reshape_checkpoint", "reshape", "reshape"),
        ("check_pt_file", "ptfile", "check"),
        ("HF_CONFIG", "hf_folder", "CONFIG"),
        ("LOSS_SCALER_STATE_FIELDS", "loss_scale", "STATE_FIELDS"),
        ("UNIVERSAL_FOLDER", "universal", "FOLDER"),
        ("UNIVERSAL_GLOBAL_STATE", "universal", "GLOBAL_STATE"),
    ],
)
def test_a_renamed_name_is_its_module_s_object(public, module, name):
    """Even after the submodule is imported (which binds `mds_checkpoint.reshape` to the module,
    hence the function's public name `reshape_checkpoint`)."""
    submodule = importlib.import_module(f"mds_checkpoint.{module}")
    assert getattr(mds_checkpoint, public) is getattr(submodule, name)
    assert public in mds_checkpoint.__all__ and public in dir(mds_checkpoint)


def test_every_public_name_is_listed_once_in_each_table():
    lazy = list(mds_checkpoint._MODULE_OF) + list(mds_checkpoint._RENAMED)
    assert sorted(lazy) == sorted(mds_checkpoint.__all__)
    assert len(set(mds_checkpoint.__all__)) == len(mds_checkpoint.__all__)
