"""Zero-shot evaluation as Megatron's `tasks/zeroshot_gpt` does it: WikiText-103 perplexity with
overlapping windows and the word-level (tokenization-adjusted) figure, and LAMBADA last-word
accuracy (strict and non-strict). The README ("Evaluation") states the rules in full.

One deliberate difference: losses and argmaxes use the logits of the real vocabulary, not
Megatron's padded one (the padding rows are not tokens; a Hugging Face export drops them, so its
perplexity is ours; on a trained model their logits are trained far down and the figures agree).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .config import EvalConfig
from .detokenize import wikitext_detokenize
from .loading import load

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Window:
    tokens: list[int]  # seq_len + 1 ids (EOD-padded)
    mask: list[int]  # seq_len: 1 where the target counts


def wikitext_windows(tokens: list[int], *, seq_len: int, overlap: int, pad: int) -> list[Window]:
    """Megatron's `_LMDataset`: windows of seq_len + 1 tokens starting every `overlap` tokens;
    after the first, only the last `overlap` targets of a window count (when overlap != seq_len),
    so each token is predicted once with up to seq_len - overlap tokens of context."""
    overlap = max(1, overlap)
    targets = max(len(tokens) - 1 - overlap, 0)
    num_windows = max(math.ceil(targets / overlap) + 1, 1)
    windows = []
    for index in range(num_windows):
        start = index * overlap
        ids = tokens[start : start + seq_len + 1]
        mask = [1] * len(ids)
        if len(ids) < seq_len + 1:
            mask += [0] * (seq_len + 1 - len(ids))
            ids = ids + [pad] * (seq_len + 1 - len(ids))
        mask = mask[1:]
        if overlap != seq_len and index != 0:
            mask = [0] * (seq_len - overlap) + mask[-overlap:] if overlap < seq_len else mask
        windows.append(Window(ids, mask))
    return windows


def lambada_window(
    context: list[int], target: list[int], *, seq_len: int, pad: int
) -> tuple[Window, int]:
    """Megatron's `_LambadaDataset` item: context + target, targets masked in; (window, number of
    context tokens cut from the left to fit seq_len + 1)."""
    cut = max(0, len(context) + len(target) - (seq_len + 1))
    context = context[cut:]
    ids = context + target
    mask = ([0] * len(context) + [1] * len(target))[1:]
    return Window(ids, mask), cut


def lambada_example(tokenizer, text: str, *, strict: bool) -> tuple[list[int], list[int]]:
    """(context ids, target ids): non-strict, the last token of the whole text; strict, the last
    word `w`: context = text before its last occurrence, stripped; target = tokens of ' ' + w."""
    if not strict:
        tokens = tokenizer.encode(text)
        return tokens[:-1], tokens[-1:]
    word = text.split()[-1]
    return tokenizer.encode(text[: text.rfind(word)].strip()), tokenizer.encode(" " + word)


def _batches(windows: list[Window], size: int, pad: int, device):
    for first in range(0, len(windows), size):
        chunk = windows[first : first + size]
        width = max(len(w.tokens) for w in chunk)  # shorter than seq_len + 1: same result
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros(len(chunk), width - 1, dtype=torch.bool)
        for row, window in enumerate(chunk):
            ids[row, : len(window.tokens)] = torch.tensor(window.tokens)
            mask[row, : len(window.mask)] = torch.tensor(window.mask, dtype=torch.bool)
        yield first, ids.to(device), mask.to(device)


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    """(B, S) -> fp32 logits of the real vocabulary (B, S, V)."""
    return model.logits(ids)[..., : model.config.vocab_size].float()


@torch.inference_mode()
def wikitext_loss(model, windows, *, batch_size: int, pad: int, device, log_interval: int):
    total = torch.zeros((), dtype=torch.float64, device=device)
    for number, (first, ids, mask) in enumerate(_batches(windows, batch_size, pad, device), 1):
        logits = _logits(model, ids[:, :-1])
        losses = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        total += (losses * mask).sum(dtype=torch.float64)
        if number % log_interval == 0:
            logger.info("windows %d/%d", min(first + batch_size, len(windows)), len(windows))
    return float(total)


@torch.inference_mode()
def lambada_correct(model, windows, *, batch_size: int, pad: int, device, log_interval: int):
    correct = 0
    for number, (first, ids, mask) in enumerate(_batches(windows, batch_size, pad, device), 1):
        predicted = _logits(model, ids[:, :-1]).argmax(dim=-1)
        right = (predicted == ids[:, 1:]) | ~mask
        correct += int(right.all(dim=-1).sum())
        if number % log_interval == 0:
            logger.info("examples %d/%d", min(first + batch_size, len(windows)), len(windows))
    return correct


def results_line(task: str, result: dict) -> str:
    """Megatron's line (printed between two lines of dashes)."""
    text = f" validation results on {task.upper()} | "
    if task == "wikitext103":
        text += (
            f"avg loss: {result['avg_loss']:.4E} | ppl: {result['ppl']:.4E} | "
            f"adjusted ppl: {result['adjusted_ppl']:.4E} | token ratio: {result['token_ratio']} |"
        )
    else:
        text += (
            f"number correct: {result['num_correct']:.4E} | total examples: "
            f"{result['num_examples']:.4E} | avg accuracy: {result['accuracy']:.4E}"
        )
    return text


def evaluate_wikitext(config: EvalConfig, loaded, seq_len: int) -> dict:
    text = _read_text(config)
    num_original = len(text.strip().split(" "))
    tokens = loaded.tokenizer.encode(wikitext_detokenize(text))
    if len(tokens) < 2 or num_original < 2:
        raise ValueError(f"{config.valid_data}: too little text to evaluate (needs 2 tokens)")
    pad = loaded.tokenizer.eod
    windows = wikitext_windows(tokens, seq_len=seq_len, overlap=config.overlapping_eval, pad=pad)
    total = wikitext_loss(
        loaded.model,
        windows,
        batch_size=config.micro_batch_size,
        pad=pad,
        device=loaded.device,
        log_interval=config.log_interval,
    )
    val_loss = total / (len(tokens) - 1)
    token_ratio = (len(tokens) - 1) / (num_original - 1)
    return {
        "avg_loss": val_loss,
        "ppl": math.exp(min(20, val_loss)),
        "adjusted_ppl": math.exp(min(20, val_loss * token_ratio)),
        "token_ratio": token_ratio,
        "num_tokenized_tokens": len(tokens),
        "num_original_tokens": num_original,
        "num_windows": len(windows),
    }


def evaluate_lambada(config: EvalConfig, loaded, seq_len: int) -> dict:
    pad, windows, num_cut = loaded.tokenizer.eod, [], 0
    for number, line in enumerate(_read_text(config).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            text = json.loads(line)["text"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ValueError(
                f'{config.valid_data}:{number}: expected a JSON object with a "text" field'
            ) from None
        if not isinstance(text, str) or not text.split():
            raise ValueError(f'{config.valid_data}:{number}: "text" holds no words')
        context, target = lambada_example(loaded.tokenizer, text, strict=config.strict_lambada)
        window, cut = lambada_window(context, target, seq_len=seq_len, pad=pad)
        windows.append(window)
        num_cut += cut > 0
    if not windows:
        raise ValueError(f"{config.valid_data}: no examples")
    if num_cut:
        logger.warning("%d examples longer than --seq-length lost their first tokens", num_cut)
    correct = lambada_correct(
        loaded.model,
        windows,
        batch_size=config.micro_batch_size,
        pad=pad,
        device=loaded.device,
        log_interval=config.log_interval,
    )
    return {
        "num_correct": correct,
        "num_examples": len(windows),
        "accuracy": correct / len(windows),
    }


def _read_text(config: EvalConfig) -> str:
    try:
        return config.valid_data.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{config.valid_data}: not UTF-8 text (byte {error.start})") from None


def run_eval(config: EvalConfig) -> dict:
    if not config.valid_data.is_file():
        raise ValueError(f"--valid-data {config.valid_data}: no such file")
    loaded = load(config.source)
    model_config = loaded.model.config
    seq_len = config.seq_length or model_config.seq_length
    if seq_len > model_config.max_positions:
        raise ValueError(
            f"--seq-length {seq_len} exceeds the model's max_position_embeddings "
            f"({model_config.max_positions})"
        )
    evaluate = evaluate_wikitext if config.task == "wikitext103" else evaluate_lambada
    result = evaluate(config, loaded, seq_len)
    line = results_line(config.task, result)
    print("-" * (len(line) + 1))
    print(line)
    print("-" * (len(line) + 1))
    return result
