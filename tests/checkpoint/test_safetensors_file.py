"""safetensors_file reads what the safetensors library writes, tensor for tensor, bit for bit."""

import struct

import numpy as np
import pytest
import torch
from mds_checkpoint.arrays import as_tensor
from mds_checkpoint.safetensors_file import read_header, read_tensor
from safetensors.torch import save_file


def test_every_dtype_reads_as_the_library_wrote_it(tmp_path):
    generator = torch.Generator().manual_seed(0)
    tensors = {
        "f32": torch.randn(3, 5, generator=generator),
        "f16": torch.randn(7, generator=generator).half(),
        "bf16": torch.randn(2, 3, 4, generator=generator).bfloat16(),
        "i64": torch.arange(6).reshape(2, 3),
        "u8": torch.arange(4, dtype=torch.uint8),
        "empty": torch.zeros(0, 3),
        "scalar": torch.tensor(2.5),
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    header = read_header(path)
    assert sorted(header) == sorted(tensors)
    for name, expected in tensors.items():
        got = as_tensor(read_tensor(path, header[name]))
        assert got.dtype == expected.dtype and got.shape == expected.shape, name
        assert torch.equal(got, expected), name


def test_malformed_files_fail_in_one_line(tmp_path):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(b"1234")
    with pytest.raises(ValueError, match="shorter than its header length"):
        read_header(path)
    path.write_bytes(struct.pack("<Q", 10) + b"{not json}")
    with pytest.raises(ValueError, match=r"bad.safetensors: not a safetensors file \(header"):
        read_header(path)
    save_file({"w": torch.ones(4)}, str(path))
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(ValueError, match="w's bytes 0..16 do not fit its shape or file"):
        read_header(path)
    header = struct.pack("<Q", 64) + b'{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    path.write_bytes(header.ljust(8 + 64) + np.ones(2, np.float32).tobytes())
    assert read_tensor(path, read_header(path)["w"]).tolist() == [1.0, 1.0]
