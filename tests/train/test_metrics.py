"""metrics.jsonl is strict JSON whatever the losses, and the validation block of a NaN loss says
NaN for its perplexity too (Megatron's exp(min(20, loss)) turns NaN into exp(20))."""

import json
import math

from mds_train.metrics import MetricsWriter, validation_lines


def test_a_nan_or_infinite_value_is_written_as_null(tmp_path):
    writer = MetricsWriter(output_dir=tmp_path, tensorboard_dir=None, queue_size=1)
    writer.record({"event": "validation", "iteration": 3, "lm_loss": math.nan, "at": "x"})
    writer.record({"event": "train", "iteration": 4, "lm_loss": 2.5, "grad_norm": math.inf})
    writer.close()

    def refuse(constant):
        raise AssertionError(f"{constant} is not JSON")

    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line, parse_constant=refuse) for line in lines]
    assert records == [
        {"event": "validation", "iteration": 3, "lm_loss": None, "at": "x"},
        {"event": "train", "iteration": 4, "lm_loss": 2.5, "grad_norm": None},
    ]


def test_validation_block_of_a_finite_and_a_nan_loss():
    rule, text, _ = validation_lines("iteration 10", 8.235478)
    assert text == (
        " validation loss at iteration 10 | lm loss value: 8.235478E+00 | "
        f"lm loss PPL: {math.exp(8.235478):.6E} | "
    )
    assert rule == "-" * (len(text) + 1)
    assert validation_lines("iteration 10", 25.0)[1].endswith(f"PPL: {math.exp(20):.6E} | ")
    nan = validation_lines("the end of training for val data", math.nan)[1]
    assert "lm loss value: NAN | lm loss PPL: NAN | " in nan
