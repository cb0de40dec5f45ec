"""Against transformers: a Hugging Face GPT-2 folder generates the same greedy tokens in ours and in
`GPT2LMHeadModel.generate`, and `eval --task wikitext103` gives the perplexity transformers
computes on the same windows (counted independently here)."""

import math

import pytest
import transformers
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

PROMPTS = ["The history of the city", "A", "In 1998 the company announced that it would"]
WIKITEXT = (
    " = Valkyria Chronicles III = \n \n Senjō no Valkyria 3 : Unrecorded Chronicles ( Japanese : "
    "戦場のヴァルキュリア3 , lit . Valkyria of the Battlefield 3 ) , commonly referred to as "
    "Valkyria Chronicles III outside Japan , is a tactical role @-@ playing video game developed "
    "by Sega and Media.Vision for the PlayStation Portable . Released in January 2011 in Japan , "
    "it is the third game in the Valkyria series . \n \n = = Gameplay = = \n \n As with previous "
    "Valkyira Chronicles games , Valkyria Chronicles III is a tactical role @-@ playing game "
    "where players take control of a military unit and take part in missions against enemy "
    "forces . Stories are told through comic book @-@ like panels with animated character "
    "portraits , with characters speaking partially through voiced speech bubbles and partially "
    "through unvoiced text . The game 's battle system , the BliTZ system , is carried over "
    "directly from Valkyira Chronicles . It cost 1 @,@ 000 yen and weighed 2 @.@ 5 kg . \n"
)


@pytest.fixture(scope="module")
def hf_model(hf_folder):
    return transformers.GPT2LMHeadModel.from_pretrained(hf_folder).eval()


def test_greedy_tokens_equal_transformers_generate(hf_folder, hf_model, helpers):
    loaded = load(ModelSource(load=hf_folder, device="cpu"))  # vocabulary from the folder
    generator = Generator(loaded.model, loaded.tokenizer, device=loaded.device)
    prompts = [loaded.tokenizer.encode(text) for text in PROMPTS]
    sampler = Sampler(SamplingConfig(greedy=True), vocab_size=5000, device=loaded.device)
    ours = generator.generate(
        prompts, sampler=sampler, generation=GenerationConfig(max_new_tokens=20, stop_at_eod=False)
    )
    for prompt, completion in zip(prompts, ours, strict=True):
        assert list(completion.token_ids) == helpers.greedy_hf(hf_model, prompt, 20)


def test_wikitext_perplexity_equals_transformers_on_the_same_windows(
    hf_folder, hf_model, tmp_path, helpers
):
    path = tmp_path / "wiki.test.tokens"
    path.write_text(WIKITEXT, encoding="utf-8")
    result = run_eval(
        EvalConfig(
            source=ModelSource(load=hf_folder, device="cpu"),
            task="wikitext103",
            valid_data=path,
            seq_length=64,
            overlapping_eval=16,
            micro_batch_size=3,
        )
    )
    tokenizer = load(ModelSource(load=hf_folder, device="cpu")).tokenizer
    tokens = tokenizer.encode(wikitext_detokenize(WIKITEXT))
    assert len(tokens) > 150  # several overlapping windows
    loss = helpers.transformers_wikitext(hf_model, tokens, seq_len=64, overlap=16)
    assert result["avg_loss"] == pytest.approx(loss, rel=1e-5)
    assert result["ppl"] == pytest.approx(math.exp(loss), rel=1e-5)
    words = len(WIKITEXT.strip().split(" "))
    ratio = (len(tokens) - 1) / (words - 1)
    assert result["token_ratio"] == ratio
    assert result["adjusted_ppl"] == pytest.approx(math.exp(loss * ratio), rel=1e-5)
