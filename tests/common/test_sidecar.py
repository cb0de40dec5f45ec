"""mds_common.sidecar: the common keys first, versions from the installed metadata."""

import json
from importlib.metadata import version

import pytest
from mds_common.sidecar import write_sidecar


def test_common_keys_first_then_the_fields(tmp_path):
    (tmp_path / "a.jsonl").write_text("")
    path = tmp_path / "out.merge.json"
    written = write_sidecar(
        path,
        tool="mds-index merge",
        distribution="mds-indexed-data",
        inputs=[tmp_path / "a.jsonl", "relative"],
        num_documents=3,
    )
    assert json.loads(path.read_text()) == written
    assert list(written) == ["tool", "version", "inputs", "num_documents"]
    assert written["version"] == version("mds-indexed-data")
    assert written["inputs"][0] == str((tmp_path / "a.jsonl").resolve())
    assert written["inputs"][1].startswith("/")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "out.merge.json"]


def test_common_keys_cannot_be_overridden(tmp_path):
    with pytest.raises(ValueError, match="version"):
        write_sidecar(tmp_path / "x.json", tool="t", distribution="d", inputs=[], version="1")
