"""Megatron's zero-shot rules: the WikiText detokenizer, the overlapping windows (each target
scored once), LAMBADA's strict and non-strict examples and its accuracy."""

import json
import math

import pytest
from mds_generate import (
    EvalConfig,
    GenerationConfig,
    Generator,
    ModelSource,
    Sampler,
    SamplingConfig,
    load,
    run_eval,
)
from mds_generate.detokenize import wikitext_detokenize
from mds_generate.evaluation import lambada_example, lambada_window, wikitext_windows


def test_wikitext_detokenizer_rules():
    text = (
        " = = Early life = = \n It 's 1 @,@ 000 km ( 620 mi ) long , the players ' union "
        'said " yes " ; 3 @.@ 5 ° C in the mid @-@ 1990s . N of them : [ a ] ! \n'
    )
    assert wikitext_detokenize(text) == (
        " == Early life ==\nIt's 1,000 km (620 mi) long, the players' union "
        'said "yes"; 3.5°C in the mid-1990s. 1 of them: [a]!\n'
    )


@pytest.mark.parametrize(
    ("num_tokens", "seq_len", "overlap"), [(300, 64, 16), (50, 64, 32), (65, 64, 64), (200, 32, 7)]
)
def test_windows_score_every_target_once(num_tokens, seq_len, overlap):
    tokens = list(range(num_tokens))
    windows = wikitext_windows(tokens, seq_len=seq_len, overlap=overlap, pad=-1)
    targets = max(num_tokens - 1 - overlap, 0)
    assert len(windows) == max(math.ceil(targets / overlap) + 1, 1)  # Megatron's count
    scored = []
    for index, window in enumerate(windows):
        assert len(window.tokens) == seq_len + 1 and len(window.mask) == seq_len
        start = index * overlap
        for position, counted in enumerate(window.mask):
            if counted:
                assert window.tokens[position + 1] == start + position + 1  # never padding
                scored.append(start + position + 1)
    assert scored == list(range(1, num_tokens))
    if overlap < seq_len and num_tokens > overlap + seq_len:  # window 1 holds no padding
        context = seq_len - overlap  # every later window scores its last `overlap` targets
        assert windows[1].mask == [0] * context + [1] * overlap


def test_lambada_examples_strict_and_not(tokenizer):
    text = "He opened the door and saw his old friend Rosalind"
    context, target = lambada_example(tokenizer, text, strict=True)
    assert context == tokenizer.encode("He opened the door and saw his old friend")
    assert target == tokenizer.encode(" Rosalind") and len(target) > 1
    context, target = lambada_example(tokenizer, text, strict=False)
    whole = tokenizer.encode(text)
    assert (context, target) == (whole[:-1], whole[-1:])
    window, cut = lambada_window([1, 2, 3, 4, 5], [6, 7], seq_len=4, pad=0)
    assert (window.tokens, window.mask, cut) == ([3, 4, 5, 6, 7], [0, 0, 1, 1], 2)


def test_lambada_accuracy_counts_whole_words(hf_folder, tmp_path):
    """Texts ending in the model's own greedy continuation are right, strict and not; the same
    texts with another last word are wrong."""
    loaded = load(ModelSource(load=hf_folder, device="cpu"))
    tokenizer, generator = (
        loaded.tokenizer,
        Generator(loaded.model, loaded.tokenizer, device=loaded.device),
    )
    right = []
    for prompt in ("The history of the city", "She said that the", "In the morning we went to"):
        (completion,) = generator.generate(
            [tokenizer.encode(prompt)],
            sampler=Sampler(SamplingConfig(greedy=True), vocab_size=5000, device=loaded.device),
            generation=GenerationConfig(max_new_tokens=1),
        )
        text = prompt + completion.text
        if completion.text.startswith(" ") and len(completion.text.split()) == 1:
            if tokenizer.encode(text) == tokenizer.encode(prompt) + list(completion.token_ids):
                right.append(text)
    assert len(right) >= 2
    wrong = [text.rsplit(" ", 1)[0] + " zebra" for text in right]
    path = tmp_path / "lambada.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in right + wrong))
    for strict in (False, True):
        result = run_eval(
            EvalConfig(
                source=ModelSource(load=hf_folder, device="cpu"),
                task="lambada",
                valid_data=path,
                strict_lambada=strict,
                micro_batch_size=2,
            )
        )
        assert result["num_examples"] == 2 * len(right)
        assert result["num_correct"] == len(right)
