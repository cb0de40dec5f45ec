"""Issue #21, case 5: a GPU recipe's `--distributed-backend nccl` and `--fp16` where there is no GPU
(gloo and fp32, each one note), and a backend torch lacks otherwise (one error line)."""

import pytest
import typer
from mds_common.argv import normalise, option_specs
from mds_train.cli import build_config, make_app
from mds_train.fallbacks import choose_backend, without_fp16

ARGV = """--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 8 --micro-batch-size 1
--lr 1e-3 --train-iters 2 --data-path D --vocab-file v.json --merge-file m.txt --fp16""".split()
SEED_FILE = {"zero_optimization": {"stage": 1}, "fp16": {"enabled": True, "loss_scale_window": 500}}


def parse(argv: list[str]) -> dict:
    command = typer.main.get_command(make_app())
    with command.make_context("mds-train", normalise(argv, option_specs(command)).args) as ctx:
        return dict(ctx.params)


def test_nccl_without_a_gpu_is_gloo_with_a_note():
    def torch_cpu_build(name):  # torch's CPU wheels: is_nccl_available() is False
        return name == "gloo"

    assert choose_backend("nccl", cuda=False, available=torch_cpu_build) == (
        "gloo",
        "--distributed-backend nccl: no GPU here; using gloo",
    )
    assert choose_backend(None, cuda=False, available=torch_cpu_build) == ("gloo", None)
    assert choose_backend("gloo", cuda=False, available=torch_cpu_build) == ("gloo", None)
    assert choose_backend("nccl", cuda=True, available=lambda name: True) == ("nccl", None)
    assert choose_backend(None, cuda=True, available=lambda name: True) == ("nccl", None)


def test_a_backend_torch_lacks_is_one_error_naming_the_flag():
    with pytest.raises(ValueError, match=r"^--distributed-backend nccl: this torch build has no"):
        choose_backend("nccl", cuda=True, available=lambda name: name == "gloo")
    with pytest.raises(ValueError, match=r"^--distributed-backend gloo: .* no gloo"):
        choose_backend("gloo", cuda=False, available=lambda name: False)


def test_fp16_without_device_support_trains_in_fp32():
    config = build_config(parse(ARGV))
    same = without_fp16(config, SEED_FILE, fp16_supported=True)
    assert same == (config, SEED_FILE, None)
    config32, user, note = without_fp16(config, SEED_FILE, fp16_supported=False)
    assert not config32.precision.fp16 and config32.params_dtype == "float32"
    assert "fp16" not in user and user["zero_optimization"] == {"stage": 1}
    assert note == "fp16: no GPU here and DeepSpeed has no fp16 on this CPU; training in fp32"
