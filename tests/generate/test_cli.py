"""`mds-generate` as a user runs it (in process, through the dialect's `run_app`): the four modes,
Megatron's command lines, the output files, and one clear line for each bad input."""

import io
import json
import shutil
import sys

import pytest
from mds_generate.cli import main

GREEDY = ["--greedy", "--device", "cpu", "--max-new-tokens", "12"]


def run(capsys, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
    if stdin is not None:
        sys.stdin = io.StringIO(stdin)
    try:
        with pytest.raises(SystemExit) as exit_:
            main([str(arg) for arg in args])
    finally:
        sys.stdin = sys.__stdin__
    captured = capsys.readouterr()
    return exit_.value.code, captured.out, captured.err


def error_line(capsys, *args, prog="mds-generate") -> str:
    code, out, err = run(capsys, *args)
    lines = err.strip().splitlines()
    assert code == 1 and out == "" and "Traceback" not in err, err
    assert lines[-1].startswith(f"{prog}: error: "), err
    return lines[-1][len(f"{prog}: error: ") :]


def test_every_prompt_line_is_a_prompt_the_last_and_stop_included(capsys, hf_folder, tmp_path):
    prompts = ["The city", "please stop here", "", "A last line without a newline"]
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(prompts))  # no newline at the end
    code, out, _ = run(capsys, "--load", hf_folder, "--sample-input-file", path, *GREEDY)
    assert code == 0 and out == ""
    records = [json.loads(line) for line in (tmp_path / "prompts.txt.out").read_text().splitlines()]
    assert [r["prompt"] for r in records] == prompts
    for record in records:
        assert set(record) == {"prompt", "completion", "token_ids", "finish_reason"}
        assert record["finish_reason"] in ("eod", "length") and record["token_ids"]
    sidecar = json.loads((tmp_path / "prompts.txt.out.generate.json").read_text())
    assert sidecar["tool"] == "mds-generate" and sidecar["config"]["mode"] == "input-file"
    assert sidecar["inputs"][-1] == str(path.resolve())
    # One --prompt streams the same greedy completion; so does stdin, line by line.
    code, out, _ = run(capsys, "--load", hf_folder, "--prompt", prompts[1], *GREEDY)
    assert (code, out) == (0, records[1]["completion"] + "\n")
    code, out, _ = run(capsys, "--load", hf_folder, *GREEDY, stdin=f"{prompts[0]}\n{prompts[3]}")
    assert (code, out) == (0, records[0]["completion"] + "\n" + records[3]["completion"] + "\n")


def test_megatron_generate_samples_command_line(capsys, hf_folder, tiny_vocab, tmp_path):
    vocab, merges = tiny_vocab
    megatron = [
        *("--tensor-model-parallel-size", 1, "--num-layers", 2, "--hidden-size", 64),
        *("--load", hf_folder, "--num-attention-heads", 4, "--max-position-embeddings", 128),
        *("--tokenizer-type", "GPT2BPETokenizer", "--micro-batch-size", 2, "--seq-length", 128),
        *("--out-seq-length", 10, "--temperature", 0.9, "--vocab-file", vocab),
        *("--merge-file", merges, "--num-samples", 3, "--top_p", 0.9, "--top_k", 40),
        *("--recompute", "--device", "cpu"),
    ]
    outputs = []
    for name in ("a.json", "b.json"):
        code, _, err = run(capsys, *megatron, "--genfile", tmp_path / name)
        assert code == 0, err
        outputs.append((tmp_path / name).read_text())
    assert outputs[0] == outputs[1]  # the same --seed (default 1234), the same samples
    samples = [json.loads(line) for line in outputs[0].splitlines()]
    assert len(samples) == 3 and len({s["text"] for s in samples}) == 3
    for sample in samples:
        assert set(sample) == {"text", "length", "finished"}
        assert sample["length"] <= 10 and sample["finished"] == (sample["length"] < 10)
    code, _, _ = run(capsys, *megatron, "--genfile", tmp_path / "c.json", "--seed", 5)
    assert (tmp_path / "c.json").read_text() != outputs[0]


def test_stop_strings_from_the_command_line(capsys, hf_folder):
    code, free, _ = run(capsys, "--load", hf_folder, "--prompt", "The city", *GREEDY)
    stop = free[4:6]
    code, stopped, _ = run(
        capsys, "--load", hf_folder, "--prompt", "The city", *GREEDY, "--stop", stop, "zzzz"
    )
    assert code == 0 and stopped == free[: free.find(stop)] + "\n"


def test_eval_prints_megatrons_lines(capsys, hf_folder, tmp_path):
    path = tmp_path / "wiki.test.tokens"
    path.write_text(" = Title = \n \n The game 's battle system , the BliTZ system . \n" * 4)
    code, out, _ = run(
        capsys, "eval", "--load", hf_folder, "--task", "WIKITEXT103", "--valid-data", path,
        "--seq-length", 32, "--overlapping-eval", 8, "--device", "cpu",
    )  # fmt: skip
    dashes, line, dashes_again = out.splitlines()
    assert code == 0 and dashes == dashes_again == "-" * (len(line) + 1)
    assert line.startswith(" validation results on WIKITEXT103 | avg loss: ")
    assert " | ppl: " in line and " | adjusted ppl: " in line and line.endswith(" |")


def test_the_readmes_wikitext_line_notes_what_it_ignores(
    capsys, caplog, hf_folder, tiny_vocab, tmp_path
):
    """004's tasks/main.py WikiText-103 line (issue #21, case 6): its training flags were ignored
    without a word; each is now named once, and a model flag that differs is one line."""
    vocab, merges = tiny_vocab
    path = tmp_path / "wiki.test.tokens"
    path.write_text(" = Title = \n \n The game 's battle system , the BliTZ system . \n" * 4)
    common_task_args = [
        *("--num-layers", 2, "--hidden-size", 64, "--num-attention-heads", 4),
        *("--seq-length", 32, "--max-position-embeddings", 128, "--vocab-file", vocab),
    ]  # 004's COMMON_TASK_ARGS, scaled, without --fp16 (a CPU's float16 is slow)
    line = [
        "eval", "--task", "WIKITEXT103", *common_task_args, "--valid-data", path,
        "--tokenizer-type", "GPT2BPETokenizer", "--merge-file", merges, "--load", hf_folder,
        "--micro-batch-size", 8, "--checkpoint-activations", "--log-interval", 10,
        "--no-load-optim", "--no-load-rng", "--device", "cpu",
    ]  # fmt: skip
    caplog.clear()
    code, out, err = run(capsys, *line)
    assert code == 0 and "validation results on WIKITEXT103" in out, err
    notes = [m for m in caplog.messages if "is accepted and ignored" in m]
    assert notes == [
        "--checkpoint-activations is accepted and ignored: a training flag; the checkpoint gives "
        "the model",
        "--no-load-optim is accepted and ignored: no optimizer state is loaded here",
        "--no-load-rng is accepted and ignored: no RNG state is loaded here",
    ]
    wrong = [*line, "--num-attention-heads", 8]
    assert error_line(capsys, *wrong, prog="mds-generate eval") == (
        "--num-attention-heads 8, but the checkpoint's model has 4; drop the flag (the "
        "checkpoint says its shape)"
    )


def test_bad_inputs_are_one_line(capsys, hf_folder, tmp_path, shared_data):
    missing = tmp_path / "absent"
    assert error_line(capsys, "--load", missing, "--prompt", "x") == (
        f"--load {missing}: no such checkpoint folder"
    )
    message = error_line(
        capsys, "--load", hf_folder, "--prompt", "x", "--vocab-file",
        shared_data / "gpt2-vocab.json", "--merge-file", shared_data / "gpt2-merges.txt",
    )  # fmt: skip
    assert "50257 tokens, but the checkpoint's model was trained with a vocabulary of 5000" in (
        message
    )
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    message = error_line(capsys, "--load", hf_folder, "--sample-input-file", empty)
    assert message == f"{empty}: empty prompt file; write one prompt per line"
    long = tmp_path / "long.txt"
    long.write_text("short\n" + " ".join(["word"] * 200) + "\n")
    message = error_line(capsys, "--load", hf_folder, "--sample-input-file", long)
    assert message.startswith(f"{long}:2: the prompt has 200 tokens but the context holds 128,")
    assert not (tmp_path / "long.txt.out").exists()
    message = error_line(capsys, "--load", hf_folder, "--prompt", "x", "--num-layers", 3)
    assert message.startswith("--num-layers 3, but the checkpoint's model has 2;")
    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text((hf_folder / "config.json").read_text())
    message = error_line(capsys, "--load", no_weights, "--prompt", "x")
    assert message.startswith(f"{no_weights}: a Hugging Face folder (config.json) without weights")


@pytest.mark.parametrize("weights", ["model.safetensors", None])
def test_a_hugging_face_folder_without_config_json_is_named_so(
    capsys, hf_folder, tmp_path, weights
):
    """Weights (or only a tokenizer) without config.json: the line says what a Hugging Face
    folder lacks, not that the folder has no mds checkpoint's `latest`."""
    folder = tmp_path / "hf"
    shutil.copytree(hf_folder, folder)
    (folder / "config.json").unlink()
    if weights is None:
        (folder / "model.safetensors").unlink()
    message = error_line(capsys, "--load", folder, "--prompt", "x")
    if weights is None:
        assert message == (
            f"{folder}: tokenizer files (vocab.json, merges.txt) but no model; a Hugging Face "
            "folder holds config.json and model.safetensors (or pytorch_model.bin) beside them; "
            "give the model's folder"
        )
    else:
        assert message == (
            f"{folder}: a Hugging Face folder needs config.json beside model.safetensors; copy "
            "the model's config.json there (save_pretrained writes both)"
        )
