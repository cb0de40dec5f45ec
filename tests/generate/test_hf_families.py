"""mds-generate on the Hugging Face families past GPT-2: a random LlamaForCausalLM (grouped-query
attention, untied head, rotary theta 500000; and one with a tied head and biases),
GPTNeoXForCausalLM (partial rotary, sequential residuals) and BloomForCausalLM (ALiBi, embedding
LayerNorm), saved by save_pretrained beside the tiny GPT-2 vocabulary's files, generate greedily
the tokens of transformers' `generate`, for a ragged batch (prompts of different lengths in one
batch) and each prompt alone; the Llama imported by import-hf at TP=2 x PP=2 does too, and so
does the command line's streamed text; a folder whose embedding has rows past its tokenizer's ids
never samples them; sampling over the cache gives `--recompute`'s tokens; `eval` gives the
WikiText perplexity transformers computes on the same windows."""

import logging
import shutil

import pytest
import torch
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

from ..hf_models import tiny_hf_models

VOCAB, EOD = 5000, 4999  # the tiny GPT-2 vocabulary's (conftest)
NEW = 16
PROMPTS = ["The history of the city", "A", "In 1998 the company announced that it would"]
WIKITEXT = (
    " = Valkyria Chronicles III = \n \n Senjō no Valkyria 3 : Unrecorded Chronicles ( Japanese : "
    "戦場のヴァルキュリア3 , lit . Valkyria of the Battlefield 3 ) , commonly referred to as "
    "Valkyria Chronicles III outside Japan , is a tactical role @-@ playing video game developed "
    "by Sega and Media.Vision for the PlayStation Portable . Released in January 2011 in Japan . \n"
)

_COMMON = dict(vocab_size=VOCAB, eos_token_id=EOD, bos_token_id=EOD, attn_implementation="eager")
HF_MODELS = tiny_hf_models(max_position_embeddings=128, **_COMMON)
FAMILY = {"llama": "Llama", "llama-tied-biases": "Llama", "gpt-neox": "GPT-NeoX", "bloom": "BLOOM"}


def _far_from_init(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Norms' weights at one would hide swapped or mis-cut weights; weights this large make the
    greedy text vary and keep its argmaxes clear of ties (biases stay near zero: large ones
    would pick one token whatever the text)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 1.0 if p.dim() == 1 and not name.endswith("bias") else 0.0  # norms' weights
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2 + scale)
    return model.eval()


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_vocab):
    """built(name) -> (name, the transformers model, its save_pretrained folder with the
    vocabulary's files), made once per module."""
    made = {}

    def build(name: str):
        if name not in made:
            torch.manual_seed(0)
            model = _far_from_init(HF_MODELS[name](), seed=1)
            folder = tmp_path_factory.mktemp(name) / "hf"
            model.save_pretrained(folder)
            shutil.copyfile(tiny_vocab[0], folder / "vocab.json")
            shutil.copyfile(tiny_vocab[1], folder / "merges.txt")
            made[name] = name, model, folder
        return made[name]

    return build


@pytest.fixture(params=list(HF_MODELS))
def family(request, built):
    return built(request.param)


def _greedy(loaded, prompts: list[list[int]]) -> list[list[int]]:
    generator = Generator(loaded.model, loaded.tokenizer, device=loaded.device)
    sampler = Sampler(SamplingConfig(greedy=True), vocab_size=VOCAB, device=loaded.device)
    generation = GenerationConfig(max_new_tokens=NEW, stop_at_eod=False)
    completions = generator.generate(prompts, sampler=sampler, generation=generation)
    return [list(completion.token_ids) for completion in completions]


def test_greedy_tokens_equal_transformers_generate(family, helpers, caplog):
    name, hf_model, folder = family
    with caplog.at_level(logging.INFO, logger="mds_generate.loading"):
        loaded = load(ModelSource(load=folder, device="cpu"))  # vocabulary from the folder
    assert f"({FAMILY[name]} Hugging Face folder, 2 layers" in caplog.text
    assert loaded.kind == "hf" and loaded.model.config.vocab_size == VOCAB
    prompts = [loaded.tokenizer.encode(text) for text in PROMPTS]
    assert len({len(prompt) for prompt in prompts}) == len(prompts)  # a ragged batch
    expected = [helpers.greedy_hf(hf_model, prompt, NEW) for prompt in prompts]
    assert len({token for tokens in expected for token in tokens}) > 5  # not one repeated token
    assert _greedy(loaded, prompts) == expected  # batched
    assert [_greedy(loaded, [prompt])[0] for prompt in prompts] == expected  # alone


def test_imported_llama_generates_transformers_tokens(built, helpers, tmp_path, caplog):
    """A transformers Llama with grouped-query attention and an untied head, imported
    (import-hf at TP=2 x PP=2), then sampled greedily from the mds checkpoint."""
    _, hf_model, folder = built("llama")
    from mds_checkpoint.config import ImportConfig
    from mds_checkpoint.hf import import_hf

    save = tmp_path / "imported"
    import_hf(
        ImportConfig(
            load=folder,
            save=save,
            target_tensor_model_parallel_size=2,
            target_pipeline_model_parallel_size=2,
        )
    )
    with caplog.at_level(logging.INFO, logger="mds_generate.loading"):
        loaded = load(ModelSource(load=save, device="cpu"))
    assert "(Llama mds checkpoint, 2 layers" in caplog.text
    config = loaded.model.config
    assert (config.num_query_groups, config.untie_embeddings_and_output_weights) == (2, True)
    assert config.rotary_base == 500000.0
    prompts = [loaded.tokenizer.encode(text) for text in PROMPTS]
    expected = [helpers.greedy_hf(hf_model, prompt, NEW) for prompt in prompts]
    assert _greedy(loaded, prompts) == expected


def test_the_command_line_continues_a_prompt_as_transformers(built, helpers, capsys):
    """`mds-generate --load LLAMA_FOLDER --prompt ... --greedy`: the streamed text is the decoded
    greedy tokens of transformers' `generate`."""
    from mds_generate.cli import main

    _, hf_model, folder = built("llama")
    tokenizer = load(ModelSource(load=folder, device="cpu")).tokenizer
    expected = helpers.greedy_hf(hf_model, tokenizer.encode(PROMPTS[0]), NEW)
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                *("--load", str(folder), "--prompt", PROMPTS[0], "--greedy", "--ignore-eod"),
                *("--max-new-tokens", str(NEW), "--device", "cpu"),
            ]
        )
    captured = capsys.readouterr()
    assert exit_.value.code == 0, captured.err
    assert captured.out == tokenizer.decode(expected) + "\n"


def test_embedding_rows_past_the_tokenizer_s_ids_are_never_sampled(
    tmp_path, tiny_vocab, helpers, capsys
):
    """A GPT-NeoX folder whose embedding holds 5056 rows for the tokenizer's 5000 ids (as Pythia's
    holds 50304 for 50277): it loads, and the command line's greedy text is transformers'
    generate with those rows suppressed; the batch's ids all stay below 5000."""
    from mds_generate.cli import main

    rows = VOCAB + 56
    torch.manual_seed(0)
    config = transformers.GPTNeoXConfig(
        **{**_COMMON, "vocab_size": rows},
        hidden_size=64,
        num_attention_heads=4,
        num_hidden_layers=2,
        intermediate_size=160,
        max_position_embeddings=128,
        use_parallel_residual=False,
        tie_word_embeddings=False,
        hidden_act="gelu",
    )
    hf_model = _far_from_init(transformers.GPTNeoXForCausalLM(config), seed=2)
    with torch.no_grad():  # the extra rows would win every argmax: no row of ours may
        hf_model.get_output_embeddings().weight[VOCAB:] *= 10
    folder = tmp_path / "hf"
    hf_model.save_pretrained(folder)
    shutil.copyfile(tiny_vocab[0], folder / "vocab.json")
    shutil.copyfile(tiny_vocab[1], folder / "merges.txt")
    loaded = load(ModelSource(load=folder, device="cpu"))
    assert (loaded.model.config.vocab_size, loaded.num_ids) == (rows, VOCAB)
    prompt = loaded.tokenizer.encode(PROMPTS[2])
    unsuppressed = helpers.greedy_hf(hf_model, prompt, NEW)
    assert max(unsuppressed) >= VOCAB  # transformers' own argmax takes the extra rows
    output = hf_model.generate(
        torch.tensor([prompt]),
        do_sample=False,
        max_new_tokens=NEW,
        min_new_tokens=NEW,
        pad_token_id=EOD,
        suppress_tokens=list(range(VOCAB, rows)),
    )
    expected = output[0, len(prompt) :].tolist()
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                *("--load", str(folder), "--prompt", PROMPTS[2], "--greedy", "--ignore-eod"),
                *("--max-new-tokens", str(NEW), "--device", "cpu"),
            ]
        )
    captured = capsys.readouterr()
    assert exit_.value.code == 0, captured.err
    assert captured.out == loaded.tokenizer.decode(expected) + "\n"


def test_sampling_over_the_cache_equals_recompute(family):
    _, _, folder = family
    loaded = load(ModelSource(load=folder, device="cpu"))
    generator = Generator(loaded.model, loaded.tokenizer, device=loaded.device)
    prompts = [loaded.tokenizer.encode(text) for text in PROMPTS]

    def sample(recompute: bool) -> list[list[int]]:
        sampling = SamplingConfig(top_k=40, top_p=0.9, temperature=0.9, seed=5)
        sampler = Sampler(sampling, vocab_size=VOCAB, device=loaded.device)
        generation = GenerationConfig(max_new_tokens=NEW, stop_at_eod=False, recompute=recompute)
        done = generator.generate(prompts, sampler=sampler, generation=generation)
        return [list(completion.token_ids) for completion in done]

    cached = sample(recompute=False)
    assert cached == sample(recompute=True)
    assert len({tuple(tokens) for tokens in cached}) == len(prompts)


def test_wikitext_perplexity_equals_transformers(family, helpers, tmp_path):
    _, hf_model, folder = family
    path = tmp_path / "wiki.test.tokens"
    path.write_text(WIKITEXT, encoding="utf-8")
    source = ModelSource(load=folder, device="cpu")
    result = run_eval(
        EvalConfig(
            source=source,
            task="wikitext103",
            valid_data=path,
            seq_length=32,
            overlapping_eval=8,
            micro_batch_size=3,
        )
    )
    tokens = load(source).tokenizer.encode(wikitext_detokenize(WIKITEXT))
    assert len(tokens) > 50  # several overlapping windows
    loss = helpers.transformers_wikitext(hf_model, tokens, seq_len=32, overlap=8)
    assert result["avg_loss"] == pytest.approx(loss, rel=1e-5)
