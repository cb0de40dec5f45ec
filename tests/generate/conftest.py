"""Fixtures of the mds-generate tests: a tiny random GPT on Megatron's tiny GPT-2 vocabulary (5000
tokens), the same model as a Hugging Face folder, and one real mds-train checkpoint of layout
TP=2, PP=2 (4 CPU processes under the deepspeed launcher), shared by the whole session.

Test modules reach the helpers below through the `helpers` fixture (this module), since
pytest's importlib mode does not let them import conftest."""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import pytest
import torch
from mds_model import GPT, GPTConfig, hf_adapter
from mds_model.config import ARCHITECTURES

VOCAB_SIZE, EOD = 5000, 4999


def tiny_config(**overrides) -> GPTConfig:
    base = dict(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        vocab_size=VOCAB_SIZE,
        seq_length=128,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_fused_kernels=False,
        init_method_std=0.1,  # larger than 0.02: random text varies more than one repeated token
    )
    base.update(overrides)
    return GPTConfig(**base)


# tiny_config's overrides for a Llama-family GPT: grouped-query attention, untied head, theta.
LLAMA = dict(ARCHITECTURES["llama"], num_query_groups=2, ffn_hidden_size=96, rotary_base=500000.0)


def write_hf_folder(
    path: Path, model: GPT, vocab: tuple[Path, Path] | None = None, *, eos: int = EOD
) -> Path:
    """The model as `save_pretrained` writes its family (config.json + model.safetensors;
    mds_model.hf_families' adapter: GPT-2 for tiny_config())."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    config = model.config
    adapter = hf_adapter(config)
    (path / "config.json").write_text(json.dumps(adapter.hf_config(config, eos_token_id=eos)))
    state_dict = adapter.to_hf(model.state_dict(), config)
    save_file(state_dict, path / "model.safetensors", metadata={"format": "pt"})
    if vocab is not None:
        shutil.copyfile(vocab[0], path / "vocab.json")
        shutil.copyfile(vocab[1], path / "merges.txt")
    return path


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """Tiny models on a shared 2-core machine: one thread per op, as the training tests run
    (two threads wait for each other's time slices, 10 ms per op)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def helpers():
    return sys.modules[__name__]


@pytest.fixture(scope="session")
def tiny_vocab(shared_data) -> tuple[Path, Path]:
    folder = shared_data / "megatron-golden"
    return folder / "gpt2-tiny-vocab.json", folder / "gpt2-tiny-merges.txt"


@pytest.fixture(scope="session")
def tokenizer(tiny_vocab):
    from mds_tokenize import load_tokenizer

    return load_tokenizer(vocab_file=tiny_vocab[0], merge_file=tiny_vocab[1])


@pytest.fixture(scope="session")
def tiny_model() -> GPT:
    return GPT(tiny_config(), init_seed=7).eval()


@pytest.fixture(scope="session")
def hf_folder(tmp_path_factory, tiny_model, tiny_vocab) -> Path:
    return write_hf_folder(tmp_path_factory.mktemp("hf") / "tiny-gpt2", tiny_model, tiny_vocab)


@pytest.fixture(scope="session")
def tp2_pp2_checkpoint(tmp_path_factory, shared_data, runs) -> Path:
    """A TP=2, PP=2 mds-train checkpoint (2 layers, hidden 64, 4 heads, seq 64, tiny vocab, one
    iteration; init std 0.1 so that greedy text from random weights varies)."""
    out = tmp_path_factory.mktemp("tp2pp2")
    flags = [
        *"--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64".split(),
        *"--micro-batch-size 2 --global-batch-size 4 --tensor-model-parallel-size 2".split(),
        *"--pipeline-model-parallel-size 2 --train-iters 1 --lr 1e-4 --seed 1234".split(),
        *"--eval-iters 0 --log-interval 1 --init-method-std 0.1".split(),
        *runs.data_flags(shared_data, out / "index-cache"),
        *("--save", str(out / "checkpoints")),
    ]
    result = runs.train(flags, nproc=4, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return out / "checkpoints"


def greedy_hf(model, prompt: list[int], num_new: int) -> list[int]:
    """transformers' greedy generate of one prompt, the new ids."""
    output = model.generate(
        torch.tensor([prompt]),
        do_sample=False,
        max_new_tokens=num_new,
        min_new_tokens=num_new,
        pad_token_id=model.config.eos_token_id,
    )
    return output[0, len(prompt) :].tolist()


def transformers_wikitext(hf_model, tokens, *, seq_len: int, overlap: int) -> float:
    """Megatron's scoring, counted per target: target t is scored in window 0 when t <= seq_len,
    else in window ceil((t - seq_len) / overlap), which starts at that index times overlap."""
    total, by_window = 0.0, {}
    for t in range(1, len(tokens)):
        window = 0 if t <= seq_len else math.ceil((t - seq_len) / overlap)
        by_window.setdefault(window, []).append(t)
    with torch.no_grad():
        for window, targets in by_window.items():
            start = window * overlap
            ids = torch.tensor([tokens[start : start + seq_len]])
            log_probs = torch.log_softmax(hf_model(ids).logits[0].double(), dim=-1)
            total -= sum(float(log_probs[t - start - 1, tokens[t]]) for t in targets)
    return total / (len(tokens) - 1)
