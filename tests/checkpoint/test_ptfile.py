"""ptfile and arrays against torch, the reference: files torch.save wrote read back as arrays,
files ptfile wrote read back by torch.load (plain, weights_only and mmap), and the float
conversions bit for bit against torch's `.to()`."""

import argparse
import collections
import contextlib
import enum
import importlib
import random
import struct
import subprocess
import sys
import textwrap
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from mds_checkpoint import arrays, ptfile

DTYPE_NAMES = list(arrays.TORCH_DTYPES)
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _random_tensor(name: str, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    dtype = getattr(torch, name)
    if name == "bool":
        return torch.rand(shape, generator=generator) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(dtype)
    return torch.randint(-100 if name != "uint8" else 0, 100, shape, generator=generator).to(dtype)


def _same_as_tensor(array: np.ndarray, tensor: torch.Tensor) -> bool:
    """Same dtype, shape and bits, seen through torch's own integer views of the tensor."""
    tensor = tensor.detach().contiguous()
    bits = tensor.view(_BITS[tensor.element_size()]).numpy()
    return (
        arrays.dtype_name(array.dtype) == str(tensor.dtype).removeprefix("torch.")
        and array.shape == tuple(tensor.shape)
        and np.array_equal(array.view(bits.dtype), bits)
    )


def _data_offsets(path: Path) -> dict[str, int]:
    """Where each record's bytes start, from the local headers (as torch's reader finds them)."""
    raw = path.read_bytes()
    offsets = {}
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            name_length, extra_length = struct.unpack_from("<HH", raw, info.header_offset + 26)
            offsets[info.filename] = info.header_offset + 30 + name_length + extra_length
    return offsets


# --- torch.save -> ptfile.load -----------------------------------------------------------------


def test_reads_every_dtype_and_shape(tmp_path):
    generator = torch.Generator().manual_seed(0)
    tensors = {
        f"{name}{shape}": _random_tensor(name, shape, generator)
        for name in DTYPE_NAMES
        for shape in [(), (5,), (3, 4, 2), (0, 3)]
    }
    torch.save(tensors, tmp_path / "t.pt")
    loaded = ptfile.load(tmp_path / "t.pt")
    assert loaded.keys() == tensors.keys()
    for key, tensor in tensors.items():
        assert _same_as_tensor(loaded[key], tensor), key


def test_reads_views_and_shared_storages(tmp_path):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    views = {
        "base": base,
        "columns": base[:, 1:3],
        "transposed": base.t(),
        "row": base[2],
        "strided": base[::2, ::3],
        "expanded": torch.arange(3.0).expand(4, 3),  # stride 0
        "bf16_t": base.to(torch.bfloat16).t(),
    }
    torch.save(views, tmp_path / "v.pt")
    loaded = ptfile.load(tmp_path / "v.pt")
    for key, tensor in views.items():
        assert _same_as_tensor(loaded[key], tensor), key
    assert np.shares_memory(loaded["base"], loaded["columns"])  # one storage, one array
    assert np.shares_memory(loaded["base"], loaded["transposed"])


def test_loaded_arrays_are_private_copy_on_write(tmp_path):
    torch.save({"w": torch.ones(4, 4)}, tmp_path / "w.pt")
    loaded = ptfile.load(tmp_path / "w.pt")
    loaded["w"][0, 0] = 5.0  # writable ...
    assert ptfile.load(tmp_path / "w.pt")["w"][0, 0] == 1.0  # ... and the file unchanged
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch.from_numpy warns about read-only arrays
        tensor = arrays.as_tensor(loaded["w"])
    assert tensor[0, 0].item() == 5.0


def test_reads_training_state_objects(tmp_path):
    linear = torch.nn.Linear(3, 2)
    np_state, py_state = np.random.get_state(), random.getstate()
    state = {
        "model": linear.state_dict(),
        "parameter": torch.nn.Parameter(torch.ones(2, dtype=torch.bfloat16)),
        "nested": {"list": [torch.zeros(2), (1, "a", None)], "tuple": (torch.ones(1), [2.5])},
        "size": torch.Size([4, 5]),
        "dtypes": [torch.float16, torch.bfloat16, torch.float32],
        "device": torch.device("cpu"),
        "args": argparse.Namespace(hidden_size=64, params_dtype=torch.float16, fp16=True),
        "numpy_rng": np_state,
        "python_rng": py_state,
        "torch_rng": torch.get_rng_state(),
    }
    torch.save(state, tmp_path / "s.pt")
    loaded = ptfile.load(tmp_path / "s.pt")

    assert isinstance(loaded["model"], collections.OrderedDict)
    assert list(loaded["model"]) == ["weight", "bias"]
    assert _same_as_tensor(loaded["model"]["weight"], linear.weight)
    assert _same_as_tensor(loaded["parameter"], state["parameter"])
    assert _same_as_tensor(loaded["nested"]["list"][0], torch.zeros(2))
    assert loaded["nested"]["list"][1] == (1, "a", None)
    assert _same_as_tensor(loaded["nested"]["tuple"][0], torch.ones(1))
    assert loaded["nested"]["tuple"][1] == [2.5]
    assert loaded["size"] == (4, 5) and type(loaded["size"]) is tuple
    assert loaded["dtypes"] == ["torch.float16", "torch.bfloat16", "torch.float32"]
    assert loaded["device"] == "cpu"
    assert vars(loaded["args"]) == {
        "hidden_size": 64,
        "params_dtype": "torch.float16",
        "fp16": True,
    }
    assert loaded["numpy_rng"][0] == np_state[0] and loaded["numpy_rng"][2:] == np_state[2:]
    assert np.array_equal(loaded["numpy_rng"][1], np_state[1])
    assert loaded["python_rng"] == py_state
    assert _same_as_tensor(loaded["torch_rng"], state["torch_rng"])


# Stand-ins for the classes DeepSpeed and Megatron pickle into their checkpoints, under their real
# module names (bf16/fp16 optimizer files hold loss scalers, ZeRO stages and fragment addresses).
_STANDINS = {
    "deepspeed/utils/tensor_fragment.py": """
        from dataclasses import dataclass

        @dataclass
        class fragment_address:
            numel: int
            start: int
    """,
    "deepspeed/runtime/fp16/loss_scaler.py": """
        class DynamicLossScaler:
            def __init__(self, init_scale, scale_window):
                self.cur_scale, self.cur_iter, self.scale_window = init_scale, 0, scale_window
    """,
    "deepspeed/runtime/zero/config.py": """
        import enum

        class ZeroStageEnum(int, enum.Enum):
            disabled = 0
            optimizer_states = 1

            def __reduce_ex__(self, protocol):  # by name, as Python 3.11.2 pickles int enums
                return getattr, (type(self), self._name_)
    """,
    "megatron/enums.py": """
        import enum

        class PositionEmbeddingType(enum.Enum):
            rotary = 1
            absolute = 2

            def __reduce_ex__(self, protocol):  # by value, as Python 3.11.7 pickles enums
                return type(self), (self._value_,)
    """,
}


@contextlib.contextmanager
def _standin_modules(folder: Path):
    """Import the stand-ins from `folder`, then restore sys.path and sys.modules (and any real
    deepspeed or megatron modules) as they were."""

    def ours(name: str) -> bool:
        return name.partition(".")[0] in ("deepspeed", "megatron")

    for relative, source in _STANDINS.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
        for package in Path(relative).parents[:-1]:  # deepspeed/utils, deepspeed
            (folder / package / "__init__.py").touch()
    real = {name: sys.modules.pop(name) for name in list(sys.modules) if ours(name)}
    sys.path.insert(0, str(folder))
    try:
        yield importlib.import_module
    finally:
        sys.path.remove(str(folder))
        for name in [name for name in sys.modules if ours(name)]:
            del sys.modules[name]
        sys.modules.update(real)


@pytest.fixture
def deepspeed_like_file(tmp_path) -> Path:
    path = tmp_path / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"
    with _standin_modules(tmp_path / "standins") as import_module:
        fragment = import_module("deepspeed.utils.tensor_fragment").fragment_address
        scaler = import_module("deepspeed.runtime.fp16.loss_scaler").DynamicLossScaler
        stage = import_module("deepspeed.runtime.zero.config").ZeroStageEnum
        position = import_module("megatron.enums").PositionEmbeddingType
        optimizer = {
            "loss_scaler": scaler(65536.0, 1000),
            "zero_stage": stage.optimizer_states,
            "param_slice_mappings": [
                collections.OrderedDict(w=fragment(numel=6, start=0), b=fragment(numel=2, start=6))
            ],
            "fp32_flat_groups": [torch.arange(8, dtype=torch.float32)],
        }
        torch.save({"optimizer_state_dict": optimizer, "position": position.rotary}, path)
    return path


def test_foreign_classes_become_missing_records(deepspeed_like_file):
    loaded = ptfile.load(deepspeed_like_file)
    optimizer = loaded["optimizer_state_dict"]
    scaler = optimizer["loss_scaler"]
    assert isinstance(scaler, ptfile.Missing)
    assert type(scaler).__module__ == "deepspeed.runtime.fp16.loss_scaler"
    assert type(scaler).__name__ == "DynamicLossScaler"
    assert scaler.state == {"cur_scale": 65536.0, "cur_iter": 0, "scale_window": 1000}
    address = optimizer["param_slice_mappings"][0]["b"]
    assert isinstance(address, ptfile.Missing) and address.state == {"numel": 2, "start": 6}
    assert address.args == () and repr(address) == "fragment_address()"  # NEWOBJ: no __init__
    assert repr(optimizer["zero_stage"]) == "ZeroStageEnum('optimizer_states',)"  # by name
    assert loaded["position"].args == (1,)  # an enum pickled by value
    assert np.array_equal(optimizer["fp32_flat_groups"][0], np.arange(8, dtype=np.float32))


def test_loading_imports_neither_torch_nor_deepspeed(deepspeed_like_file, tmp_path):
    real_checkpoint = tmp_path / "model_states.pt"
    torch.save({"module": {"w": torch.ones(2, dtype=torch.bfloat16)}}, real_checkpoint)
    code = """
        import sys
        import mds_checkpoint.arrays, mds_checkpoint.ptfile
        assert "torch" not in sys.modules
        states = [mds_checkpoint.ptfile.load(path) for path in sys.argv[1:]]
        assert states[-1]["module"]["w"].dtype == mds_checkpoint.arrays.BFLOAT16
        tops = {name.partition(".")[0] for name in sys.modules}
        assert not tops & {"torch", "deepspeed", "megatron"}, tops
    """
    paths = [str(deepspeed_like_file), str(real_checkpoint)]
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *paths], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_reads_legacy_files_through_torch(tmp_path):
    state = {
        "w": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3).t(),
        "o": collections.OrderedDict(b=torch.ones(2)),
        "args": argparse.Namespace(params_dtype=torch.float16),
        "size": torch.Size([1, 2]),
    }
    torch.save(state, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    assert not zipfile.is_zipfile(tmp_path / "legacy.pt")
    loaded = ptfile.load(tmp_path / "legacy.pt")
    assert _same_as_tensor(loaded["w"], state["w"])
    assert isinstance(loaded["o"], collections.OrderedDict)
    assert _same_as_tensor(loaded["o"]["b"], state["o"]["b"])
    assert vars(loaded["args"]) == {"params_dtype": "torch.float16"}
    assert loaded["size"] == (1, 2)


# --- ptfile.save / StreamingSave -> torch.load ---------------------------------------------------


def _arrays_of_every_dtype() -> dict[str, np.ndarray]:
    generator = torch.Generator().manual_seed(1)
    result = {}
    for name in DTYPE_NAMES:
        result[name] = arrays.as_array(_random_tensor(name, (4, 6), generator))
        result[f"{name}_0d"] = arrays.as_array(_random_tensor(name, (), generator))
        result[f"{name}_columns"] = result[name][:, 1:4]  # non-contiguous inputs
        result[f"{name}_transposed"] = result[name].T
    result["empty"] = np.zeros((0, 3), np.float32)
    return result


@pytest.mark.parametrize(
    "load_args", [{}, {"weights_only": True}, {"mmap": True}], ids=["default", "weights", "mmap"]
)
def test_torch_reads_what_save_writes(tmp_path, load_args):
    tensors = _arrays_of_every_dtype()
    state = {
        "tensors": tensors,
        "ordered": collections.OrderedDict(first=tensors["float32"], second=None),
        "mixed": [1, 2.5, "text", True, None, (3, [tensors["bfloat16"]]), {"k": -7}],
    }
    ptfile.save(state, tmp_path / "saved.pt")
    loaded = torch.load(tmp_path / "saved.pt", map_location="cpu", **load_args)
    for key, array in tensors.items():
        assert _same_as_tensor(array, loaded["tensors"][key]), key
    assert isinstance(loaded["ordered"], collections.OrderedDict)
    assert _same_as_tensor(tensors["float32"], loaded["ordered"]["first"])
    assert loaded["ordered"]["second"] is None
    assert loaded["mixed"][:5] == [1, 2.5, "text", True, None]
    assert loaded["mixed"][5][0] == 3 and loaded["mixed"][6] == {"k": -7}
    assert _same_as_tensor(tensors["bfloat16"], loaded["mixed"][5][1][0])


def test_save_writes_torch_records_aligned(tmp_path):
    tensors = {"a": np.ones((3, 5), np.float32), "b": np.zeros(7, arrays.BFLOAT16)}
    (tmp_path / "ours").mkdir()
    (tmp_path / "torch").mkdir()
    ptfile.save(tensors, tmp_path / "ours/model.pt")
    torch.save({k: arrays.as_tensor(v) for k, v in tensors.items()}, tmp_path / "torch/model.pt")

    with (
        zipfile.ZipFile(tmp_path / "ours/model.pt") as ours,
        zipfile.ZipFile(tmp_path / "torch/model.pt") as theirs,
    ):
        assert ours.testzip() is None
        assert sorted(ours.namelist()) == sorted(theirs.namelist())  # same folder ("model/") too
        for name in ("model/version", "model/byteorder", "model/.format_version"):
            assert ours.read(name) == theirs.read(name), name
        assert ours.read("model/.storage_alignment") == b"64"
        assert ours.read("model/.data/serialization_id").isdigit()
        assert len(ours.read("model/.data/serialization_id")) == 40
        assert all(info.compress_type == zipfile.ZIP_STORED for info in ours.infolist())
    offsets = _data_offsets(tmp_path / "ours/model.pt")
    assert all(offset % 64 == 0 for offset in offsets.values()), offsets


def test_torch_computes_the_storage_offsets_of_saved_files(tmp_path, monkeypatch):
    """torch.load's opt-in `calculate_storage_offsets` derives offsets from miniz's layout instead
    of reading local headers; its debug mode checks them against the headers."""
    monkeypatch.setenv("TORCH_SERIALIZATION_DEBUG", "1")
    sizes = [18, 7, 0, 1, 16, 33, 0, 0, 5, 64, 100, 3]  # data ends on every side of 64 bytes
    state = {f"t{i}": np.arange(n, dtype=np.float32) + 1000 * i for i, n in enumerate(sizes)}
    ptfile.save(state, tmp_path / "s.pt")
    with ptfile.StreamingSave(tmp_path / "streamed.pt") as save:
        save.close({key: save.add(array) for key, array in state.items()})
    config = torch.utils.serialization.config
    with config.patch({"load.calculate_storage_offsets": True}):
        for name in ("s.pt", "streamed.pt"):
            loaded = torch.load(tmp_path / name, mmap=True, weights_only=True)
            for key, array in state.items():
                assert np.array_equal(loaded[key].numpy(), array), (name, key)


def test_streaming_save(tmp_path):
    path = tmp_path / "mp_rank_00_model_states.pt"
    weight = np.arange(12, dtype=np.float32).reshape(3, 4)
    with ptfile.StreamingSave(path) as save:
        module = {"w": save.add(weight.T), "b": save.add(arrays.convert(weight[0], "bfloat16"))}
        # The records are in the file before close (another thread may sync it meanwhile).
        assert path.stat().st_size >= weight.nbytes + weight[0].nbytes
        save.close({"module": module, "extra": weight[1], "iteration": 4})
    loaded = torch.load(path, weights_only=True)
    assert torch.equal(loaded["module"]["w"], torch.from_numpy(weight.T.copy()))
    assert torch.equal(loaded["module"]["b"], torch.from_numpy(weight[0]).to(torch.bfloat16))
    assert torch.equal(loaded["extra"], torch.from_numpy(weight[1]))
    assert loaded["iteration"] == 4


def test_streaming_save_interrupted_leaves_no_checkpoint(tmp_path):
    path = tmp_path / "partial.pt"
    with pytest.raises(RuntimeError, match="interrupted"), ptfile.StreamingSave(path) as save:
        save.add(np.ones(4, np.float32))
        raise RuntimeError("interrupted")
    with pytest.raises(ValueError, match="data.pkl"):
        ptfile.load(path)
    with pytest.raises(RuntimeError):
        torch.load(path)


def test_save_refuses_what_torch_has_no_tensor_for(tmp_path):
    with pytest.raises(ValueError, match="unsupported array dtype"):
        ptfile.save({"c": np.zeros(2, np.complex64)}, tmp_path / "c.pt")
    with pytest.raises(ValueError, match="unsupported array dtype"):
        ptfile.save({"big": np.zeros(2, ">f4")}, tmp_path / "big.pt")


def test_round_trip(tmp_path):
    tensors = _arrays_of_every_dtype()
    state = collections.OrderedDict(
        tensors=tensors, meta={"tuple": (1, None), "list": [1.5, "x"], "flag": False}
    )
    ptfile.save(state, tmp_path / "r.pt")
    loaded = ptfile.load(tmp_path / "r.pt")
    assert isinstance(loaded, collections.OrderedDict)
    assert loaded["meta"] == state["meta"]
    for key, array in tensors.items():
        assert arrays.bitwise_equal(loaded["tensors"][key], array), key


# --- arrays ---------------------------------------------------------------------------------------


def _edge_float32() -> np.ndarray:
    generator = np.random.default_rng(2)
    exponents = generator.integers(-140, 128, 2000).astype(np.float32)
    random_values = generator.standard_normal(2000).astype(np.float32) * np.exp2(exponents)
    bits = generator.integers(0, 2**16, 200, dtype=np.uint32)
    ties = ((bits << 16) | 0x8000).view(np.float32)  # exactly halfway between two bf16 values
    fp16_ties = np.float32(1.0) + np.float32(2.0**-11) * np.array([1, 3, 5], np.float32)
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 1e-40, 1e-39]
    specials += [3.3e38, 3.39e38, np.finfo(np.float32).max, 65504.0, 65519.0, 65520.0, 7e4]
    specials += [6e-8, 3e-8, 2.9e-8, 6.1e-5, 5.96e-8, 1e-5, -65520.0]
    parts = [random_values, ties[np.isfinite(ties)], fp16_ties, np.array(specials, np.float32)]
    return np.concatenate(parts)


@pytest.mark.parametrize("source", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("target", ["float32", "float16", "bfloat16"])
def test_convert_matches_torch(source, target):
    reference = torch.from_numpy(_edge_float32()).to(getattr(torch, source))
    ours = arrays.convert(arrays.as_array(reference), target)
    expected = reference.to(getattr(torch, target))
    expected_bits = expected.view(_BITS[expected.element_size()]).numpy()
    ours_bits = ours.view(expected_bits.dtype)
    assert ours.dtype == arrays.numpy_dtype(target) and ours.shape == tuple(expected.shape)
    nan = torch.isnan(expected).numpy()
    assert np.array_equal(np.isnan(arrays.to_float32(ours)), nan)
    # NaN's bits differ between torch's own code paths (AVX2 0xFFFF, scalar c10 0x7FC0).
    assert np.array_equal(ours_bits[~nan], expected_bits[~nan])
    if target == "bfloat16" and source != "bfloat16":
        assert np.all(ours_bits[nan].view(np.uint16) == 0x7FC0)


def test_to_float32_matches_torch():
    values = torch.from_numpy(_edge_float32())
    for dtype in (torch.float16, torch.bfloat16):
        ours = arrays.to_float32(arrays.as_array(values.to(dtype)))
        expected = values.to(dtype).float().numpy()
        assert np.array_equal(ours, expected, equal_nan=True), dtype
    float32 = values.numpy()
    assert arrays.to_float32(float32) is float32


def test_bitwise_equal():
    a = arrays.convert(np.arange(12, dtype=np.float32).reshape(3, 4), "bfloat16")
    assert arrays.bitwise_equal(a.T, a.copy().T) and arrays.bitwise_equal(a[:, 1:], a[:, 1:].copy())
    assert not arrays.bitwise_equal(a, a.T) and not arrays.bitwise_equal(a[:, :2], a[:, 1:3])
    nan = np.array([np.nan], np.float32)
    assert arrays.bitwise_equal(nan, nan.copy())
    assert not arrays.bitwise_equal(nan, np.array([-np.nan], np.float32))
    assert not arrays.bitwise_equal(np.zeros(2, np.float32), np.zeros(2, np.int32))


def test_tensor_views_share_memory():
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    bf16 = arrays.convert(values, "bfloat16")
    tensor = arrays.as_tensor(bf16.T)
    assert tensor.dtype == torch.bfloat16 and torch.equal(
        tensor.float(), torch.from_numpy(values.T)
    )
    back = arrays.as_array(tensor)
    assert back.dtype == arrays.BFLOAT16 and np.shares_memory(back, bf16)
    assert arrays.dtype_name(arrays.numpy_dtype("bfloat16")) == "bfloat16"
    with pytest.raises(ValueError, match="unsupported tensor dtype 'complex64'"):
        arrays.numpy_dtype("complex64")


# --- errors ---------------------------------------------------------------------------------------


def _rewritten(source: Path, target: Path, *, compress_type=zipfile.ZIP_STORED, byteorder=None):
    with zipfile.ZipFile(source) as reader, zipfile.ZipFile(target, "w", compress_type) as writer:
        for name in reader.namelist():
            data = reader.read(name)
            writer.writestr(name, byteorder if name.endswith("/byteorder") and byteorder else data)
    return target


def test_unreadable_files_are_one_line_errors(tmp_path):
    torch.save({"w": torch.ones(100)}, tmp_path / "good.pt")
    good = (tmp_path / "good.pt").read_bytes()
    (tmp_path / "text.pt").write_text("hello, not a checkpoint\n")
    (tmp_path / "truncated.pt").write_bytes(good[: len(good) // 2])
    cases = {
        tmp_path / "absent.pt": "missing file",
        tmp_path / "text.pt": "not a readable torch checkpoint file",
        tmp_path / "truncated.pt": "not a readable torch checkpoint file",
        _rewritten(tmp_path / "good.pt", tmp_path / "big.pt", byteorder=b"big"): "little-endian",
        _rewritten(
            tmp_path / "good.pt", tmp_path / "deflated.pt", compress_type=zipfile.ZIP_DEFLATED
        ): "compressed",
    }
    for path, message in cases.items():
        with pytest.raises(ValueError) as error:
            ptfile.load(path)
        text = str(error.value)
        assert text.startswith(f"{path}: ") and message in text and "\n" not in text, text


def test_pickles_a_namespace_and_an_enum_as_torch_save_does(tmp_path):
    """Megatron's `args` (an argparse.Namespace) in the bytes torch.save writes for it (protocol 2:
    GLOBAL argparse Namespace, NEWOBJ, BUILD its dict), and a class of a module that is not
    installed (bigscience's `megatron.enums.PositionEmbeddingType`) by name, as pickle writes an
    Enum member: the class called with its value."""
    args = argparse.Namespace(num_layers=2, tokenizer_type="GPT2BPETokenizer", lr=None, ids=[1, 2])
    ptfile.save({"args": args, "w": np.arange(6, dtype=np.float32)}, tmp_path / "mds.pt")
    torch.save({"args": args, "w": torch.arange(6, dtype=torch.float32)}, tmp_path / "torch.pt")

    def pickled(path: Path) -> bytes:
        with zipfile.ZipFile(path) as archive:
            return archive.read(next(n for n in archive.namelist() if n.endswith("/data.pkl")))

    assert pickled(tmp_path / "mds.pt") == pickled(tmp_path / "torch.pt")
    assert torch.load(tmp_path / "mds.pt", weights_only=False)["args"] == args

    class Reduced:  # what ptfile.GlobalName stands for, the way upstream_state uses it
        def __reduce__(self):
            return ptfile.GlobalName("megatron.enums", "PositionEmbeddingType"), (2,)

    ptfile.save({"position_embedding_type": Reduced()}, tmp_path / "enum.pt")
    enums = type(sys)("megatron.enums")
    enums.PositionEmbeddingType = enum.Enum("PositionEmbeddingType", "rotary absolute")
    enums.PositionEmbeddingType.__module__ = "megatron.enums"
    sys.modules.update({"megatron": type(sys)("megatron"), "megatron.enums": enums})
    try:
        loaded = torch.load(tmp_path / "enum.pt", weights_only=False)
    finally:
        del sys.modules["megatron"], sys.modules["megatron.enums"]
    assert loaded["position_embedding_type"] is enums.PositionEmbeddingType.absolute


def test_check_reads_only_the_directory_and_finds_a_file_cut_short(tmp_path):
    """ptfile.check, which mds-train runs over a checkpoint before loading it, says what load
    says; a zip cut short is named as such (torch.save files are zips from their first byte)."""
    torch.save({"w": torch.ones(100)}, tmp_path / "good.pt")
    good = (tmp_path / "good.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(good[:-100])
    ptfile.check(tmp_path / "good.pt")
    expected = (
        f"{tmp_path / 'cut.pt'}: not a readable torch checkpoint file (a zip archive without its "
        f"directory: the file is cut short at {len(good) - 100:,} bytes)"
    )
    for read in (ptfile.check, ptfile.load):
        with pytest.raises(ValueError) as error:
            read(tmp_path / "cut.pt")
        assert str(error.value) == expected
    with pytest.raises(ValueError, match="missing file"):
        ptfile.check(tmp_path / "absent.pt")
