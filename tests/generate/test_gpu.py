"""On a GPU: the CUDA-graph decode gives eager decoding's tokens in bf16 and fp16, the cache gives
`--recompute`'s tokens in fp32, half precision stays close to fp32, and greedy tokens equal
transformers' on the GPU; for GPT-2 and a Llama-family GPT (grouped-query attention, untied
head), both on the fused decoding paths. Triton kernels on (as `mds-generate` runs on CUDA)."""

import pytest
import torch
from mds_generate import GenerationConfig, Generator, Sampler, SamplingConfig
from mds_generate.loading import inference_config
from mds_model import GPT

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
# Mixed lengths; ids of the tiny vocabulary (5000), end-of-document 4999 never among them.
PROMPTS = [
    [464, 2106, 286, 262, 1748],
    [32],
    [818, 795, 262, 1664, 3414, 326, 340, 561, 1382],
    [15],
]


class Ids:
    """The tokenizer the Generator needs, for ids only."""

    vocab_size, eod = 5000, 4999

    def decode(self, ids) -> str:
        return " ".join(map(str, ids))


ARCHITECTURES = ["gpt2", "llama"]


def tiny(helpers, architecture: str):
    return helpers.tiny_config(**(helpers.LLAMA if architecture == "llama" else {}))


def model_in(dtype: str, helpers, architecture: str = "gpt2") -> GPT:
    config = inference_config(tiny(helpers, architecture), dtype=dtype, device=CUDA)
    cpu = GPT(tiny(helpers, architecture), init_seed=7)
    model = GPT(config, init_seed=None)
    model.load_state_dict(cpu.state_dict())
    return model.to(CUDA).eval()


def greedy(model, *, cuda_graphs=True, recompute=False, prompts=PROMPTS, num_new=32):
    generator = Generator(model, Ids(), device=CUDA, cuda_graphs=cuda_graphs)
    sampler = Sampler(SamplingConfig(greedy=True), vocab_size=5000, device=CUDA)
    generation = GenerationConfig(max_new_tokens=num_new, stop_at_eod=False, recompute=recompute)
    return [
        c.token_ids for c in generator.generate(prompts, sampler=sampler, generation=generation)
    ]


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cuda_graphs_give_eager_tokens_in_half_precision(dtype, architecture, helpers):
    model = model_in(dtype, helpers, architecture)
    assert model.config.use_fused_kernels
    graphed = greedy(model)
    assert graphed == greedy(model, cuda_graphs=False)
    # One row alone runs its projections through skinny_linear, the batch through cuBLAS: in half
    # precision their roundings differ, so alone is compared with alone.
    alone = [greedy(model, prompts=[p])[0] for p in PROMPTS]
    assert alone == [greedy(model, cuda_graphs=False, prompts=[p])[0] for p in PROMPTS]
    generator = Generator(model, Ids(), device=CUDA)
    sampler = Sampler(SamplingConfig(greedy=True), vocab_size=5000, device=CUDA)
    generation = GenerationConfig(max_new_tokens=32, stop_at_eod=False)
    first, second = (
        [c.token_ids for c in generator.generate(PROMPTS, sampler=sampler, generation=generation)]
        for _ in range(2)
    )
    assert first == second == graphed  # the kept cache and graph, replayed for a second call


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_cache_equals_recompute_on_the_gpu_in_fp32(architecture, helpers):
    model = model_in("float32", helpers, architecture)
    assert greedy(model) == greedy(model, recompute=True)


def test_half_precision_logits_stay_close_to_fp32(helpers):
    tokens = torch.tensor([PROMPTS[2]], device=CUDA)
    reference = model_in("float32", helpers).logits(tokens)
    for dtype, tolerance in (("bfloat16", 0.05), ("float16", 0.01)):
        logits = model_in(dtype, helpers).logits(tokens).float()
        scale = reference.abs().max()
        assert (logits - reference).abs().max() < tolerance * scale, dtype


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_greedy_tokens_equal_transformers_on_the_gpu(architecture, helpers, tmp_path):
    import transformers

    cpu = GPT(tiny(helpers, architecture), init_seed=7)
    folder = helpers.write_hf_folder(tmp_path / "hf", cpu)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).to(CUDA).eval()
    model = model_in("float32", helpers, architecture)
    for prompt, ours in zip(PROMPTS, greedy(model, num_new=20), strict=True):
        output = hf.generate(
            torch.tensor([prompt], device=CUDA),
            do_sample=False,
            max_new_tokens=20,
            min_new_tokens=20,
            pad_token_id=4999,
        )
        assert list(ours) == output[0, len(prompt) :].tolist()
