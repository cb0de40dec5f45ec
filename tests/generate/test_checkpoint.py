"""From a real TP=2, PP=2 mds-train checkpoint, with no model flags: the KV cache gives
`--recompute`'s greedy tokens (batched, alone, mixed prompt lengths), the vocabulary comes from
meta.json, its `mds-merge-mp export-hf` folder generates the same tokens in transformers (and in
ours), and broken checkpoints get one line."""

import json
import logging
import shutil

import pytest
import torch
import transformers
from mds_generate import GenerationConfig, Generator, ModelSource, Sampler, SamplingConfig, load
from mds_generate.cli import main
from mds_tokenize import TokenizerSpec

PROMPTS = ["The history of the city", "A", "In 1998 the company announced that it", "Hello, world"]


@pytest.fixture(scope="module")
def loaded(tp2_pp2_checkpoint):
    return load(ModelSource(load=tp2_pp2_checkpoint, device="cpu"))


def greedy(generator, prompts, **generation):
    sampler = Sampler(SamplingConfig(greedy=True), vocab_size=5000, device=torch.device("cpu"))
    config = GenerationConfig(**{"max_new_tokens": 20, "stop_at_eod": False, **generation})
    return [c.token_ids for c in generator.generate(prompts, sampler=sampler, generation=config)]


def test_cache_equals_recompute_from_a_tp2_pp2_checkpoint(loaded):
    assert loaded.kind == "mds" and loaded.meta.tensor_model_parallel_size == 2
    assert loaded.meta.pipeline_model_parallel_size == 2
    assert loaded.model.groups.tp_size == 1  # reshaped in memory
    generator = Generator(loaded.model, loaded.tokenizer, device=loaded.device)
    prompts = [loaded.tokenizer.encode(text) for text in PROMPTS]
    cached = greedy(generator, prompts)
    assert cached == greedy(generator, prompts, recompute=True)
    assert cached == [greedy(generator, [p])[0] for p in prompts]
    assert cached == [greedy(generator, [p], recompute=True)[0] for p in prompts]
    assert len({token for row in cached for token in row}) > 5  # not one repeated token


def test_transformers_generates_the_same_tokens_from_the_hf_export(
    loaded, tp2_pp2_checkpoint, tmp_path, helpers
):
    """`mds-merge-mp export-hf` of the TP=2, PP=2 checkpoint, generated greedily in transformers,
    gives our tokens from the checkpoint itself, and so does ours from the exported folder."""
    from mds_checkpoint.cli import main as merge_mp

    folder = tmp_path / "hf"
    with pytest.raises(SystemExit) as exit_:
        merge_mp(["export-hf", "--load", str(tp2_pp2_checkpoint), "--save", str(folder)])
    assert exit_.value.code == 0
    hf_model = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    generator = Generator(loaded.model, loaded.tokenizer, device=loaded.device)
    prompts = [loaded.tokenizer.encode(text) for text in PROMPTS]
    ours = greedy(generator, prompts)
    for prompt, tokens in zip(prompts, ours, strict=True):
        assert list(tokens) == helpers.greedy_hf(hf_model, prompt, 20)
    # The folder carries the checkpoint's vocabulary files; the flags naming them work too.
    vocab, merges = loaded.inputs[1:]
    assert (folder / "vocab.json").read_bytes() == vocab.read_bytes()
    assert (folder / "merges.txt").read_bytes() == merges.read_bytes()
    spec = TokenizerSpec(vocab_file=vocab, merge_file=merges)
    exported = load(ModelSource(load=folder, tokenizer=spec, device="cpu"))
    assert exported.kind == "hf"
    from_export = Generator(exported.model, exported.tokenizer, device=exported.device)
    assert greedy(from_export, prompts) == ours


def run_cli(capsys, *args) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_:
        main([str(arg) for arg in args])
    return exit_.value.code, capsys.readouterr().err.strip().splitlines()[-1]


def test_broken_checkpoints_are_one_line(capsys, tp2_pp2_checkpoint, tmp_path, shared_data):
    broken = tmp_path / "broken"
    shutil.copytree(tp2_pp2_checkpoint, broken)
    tag = (broken / "latest").read_text().strip()
    (broken / tag / "layer_03-model_01-model_states.pt").unlink()
    code, line = run_cli(capsys, "--load", broken, "--prompt", "x", "--device", "cpu")
    assert code == 1 and line.startswith("mds-generate: error: ")
    assert "layer_03-model_01-model_states.pt" in line, line
    code, line = run_cli(
        capsys, "--load", tp2_pp2_checkpoint, "--prompt", "x", "--device", "cpu",
        "--vocab-file", shared_data / "gpt2-vocab.json",
        "--merge-file", shared_data / "gpt2-merges.txt",
    )  # fmt: skip
    assert code == 1 and "50257 tokens, but the checkpoint's model was trained with a " in line
    meta_path = broken / tag / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["tokenizer"]["vocab_file"] = str(tmp_path / "moved-vocab.json")
    meta_path.write_text(json.dumps(meta))
    (broken / tag / "layer_03-model_01-model_states.pt").write_bytes(
        (tp2_pp2_checkpoint / tag / "layer_03-model_01-model_states.pt").read_bytes()
    )
    code, line = run_cli(capsys, "--load", broken, "--prompt", "x", "--device", "cpu")
    assert code == 1 and line == (
        f"mds-generate: error: {tmp_path / 'moved-vocab.json'}: no such file (the tokenizer the "
        "checkpoint's meta.json names); pass --vocab-file and --merge-file, "
        "--tokenizer-name-or-path, or --tokenizer-type with --tokenizer-model"
    )


def test_an_upstream_checkpoint_without_latest_generates_as_with_it(capsys, shared_data, tmp_path):
    """Megatron-DeepSpeed's save folder with `latest` gone: latest_checkpointed_iteration.txt
    names iteration 10, global_step10 is there (no iter_0000010), and it is the checkpoint."""
    golden = shared_data / "megatron-deepspeed-golden" / "tp2-pp1-ckpt"
    copy = tmp_path / "ckpt"
    shutil.copytree(golden, copy)
    (copy / "latest").unlink()
    flags = [
        *("--prompt", "The history of", "--greedy", "--max-new-tokens", 4, "--device", "cpu"),
        *("--vocab-file", shared_data / "gpt2-vocab.json"),
        *("--merge-file", shared_data / "gpt2-merges.txt"),
    ]
    outputs = []
    for folder in (golden, copy):
        with pytest.raises(SystemExit) as exit_:
            main([str(arg) for arg in ("--load", folder, *flags)])
        captured = capsys.readouterr()
        assert exit_.value.code == 0, captured.err
        outputs.append(captured.out)
    assert outputs[1] == outputs[0] != ""


def test_upstream_s_llama_golden_gives_its_recorded_greedy_continuation(
    capsys, caplog, shared_data
):
    """Upstream's own Llama-family checkpoint (grouped-query attention, SwiGLU, RMSNorm, untied
    head, rotary; ../shared/data/megatron-deepspeed-llama-golden) continues its prompt greedily
    with the tokens upstream's code generated (logits/upstream_eval.json)."""
    golden = shared_data / "megatron-deepspeed-llama-golden"
    recorded = json.loads((golden / "logits" / "upstream_eval.json").read_text())
    count = len(recorded["greedy_text_ids"])
    caplog.set_level(logging.INFO, logger="mds_generate.loading")
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                *("--load", str(golden / "tp2-ckpt"), "--prompt", recorded["prompt_text"]),
                *("--greedy", "--max-new-tokens", str(count), "--device", "cpu"),
                *("--vocab-file", str(golden / "vocab" / "vocab.json")),
                *("--merge-file", str(golden / "vocab" / "merges.txt")),
            ]
        )
    captured = capsys.readouterr()
    assert exit_.value.code == 0, captured.err
    assert captured.out.strip() == recorded["greedy_text"]
    assert "(Llama upstream checkpoint, 2 layers, hidden 32, float32 on cpu)" in caplog.text
