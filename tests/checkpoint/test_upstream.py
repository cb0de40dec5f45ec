"""Checkpoints that upstream deepspeedai/Megatron-DeepSpeed wrote, read by mds.

The golden (`../shared/data/megatron-deepspeed-golden/`, README there) is upstream's own TP=2
ZeRO-1 plain-engine checkpoint with the logits upstream's code computed from it. The other layouts
are written here from the golden's tensors with the transformations upstream's code defines, each
cited, and must give the same logits:
- pipeline layer files: DeepSpeed's `PipelineModule.save_state_dict` writes layer i's
  `state_dict()` to `layer_{i:02d}-model_{tp:02d}-model_states.pt`; deepspeedai's `GPTModelPipe`
  (megatron/model/gpt_model.py) numbers embedding 1, layers 2..N+1, final norm N+2; bigscience's
  inserts its two transpose lambdas (embedding 1, layers 3..N+2, final norm N+4);
- plain Megatron `iter_NNNNNNN/mp_rank_XX/model_optim_rng.pt` (`megatron/checkpointing.py`
  `get_checkpoint_name`, `save_checkpoint`'s `model` key);
- older QKV orders: the inverse of `fix_query_key_value_ordering` (megatron/checkpointing.py),
  version 0 `[3, np, hn]`, 1.0 `[np, hn, 3]`; and commit 676a482's `[Q|K|V]` blocks at 3.0.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from mds_checkpoint import load_consolidated
from mds_checkpoint.locate import Located, locate_checkpoint
from mds_model import GPT

LOGIT_ROWS = [0, 1, 64, 127]
REAL_VOCAB = 50257
# The golden's logits are ~1.1-1.5 (fp32 ulp 1.2e-7). Upstream's run had --no-bias-gelu-fusion, so
# its MLP computed F.gelu, the exact GeLU: with it mds is within 3.6e-7 (3 ulp: another summation
# order, TP=2 there, one process here); with the tanh GeLU it was 1.6e-6 away. 8e-7 holds twice
# the first and tells the two GeLUs apart.
LOGIT_ATOL = 8e-7


pytestmark = pytest.mark.usefixtures("megatron_enums")  # conftest.py


@pytest.fixture(scope="module")
def golden(shared_data) -> Path:
    return shared_data / "megatron-deepspeed-golden"


@pytest.fixture(scope="module")
def golden_states(golden) -> list[dict]:
    """Both TP ranks' mp_rank files as torch reads them."""
    folder = golden / "tp2-pp1-ckpt/global_step10"
    return [
        torch.load(folder / f"mp_rank_{tp:02d}_model_states.pt", weights_only=False)
        for tp in range(2)
    ]


def logits_of(path: Path, tokens: np.ndarray, *, activation: str | None = None, **kwargs):
    model = load_consolidated(path, **kwargs)
    config = dataclasses.replace(model.config, use_fused_kernels=False)  # the pure-torch path
    if activation is not None:
        config = dataclasses.replace(config, activation=activation)
    gpt = GPT(config)
    gpt.load_state_dict(model.state_dict)
    with torch.no_grad():
        return gpt.eval().logits(torch.from_numpy(tokens[:128].astype(np.int64))[None])[0]


def assert_golden_logits(path: Path, golden: Path, **kwargs) -> None:
    """Logits at the golden's rows within LOGIT_ATOL of upstream's, the same argmax at every
    position."""
    tokens = np.load(golden / "logits/fixed_tokens.npy")
    logits = logits_of(path, tokens, **kwargs)[:, :REAL_VOCAB]
    expected = np.load(golden / "logits/logits_rows_0_1_64_127.npy")
    np.testing.assert_allclose(logits[LOGIT_ROWS].numpy(), expected, rtol=0, atol=LOGIT_ATOL)
    assert np.array_equal(logits.argmax(-1).numpy(), np.load(golden / "logits/argmax.npy"))


def test_upstream_plain_engine_checkpoint_gives_upstream_logits(golden):
    model = load_consolidated(golden / "tp2-pp1-ckpt")
    assert model.config.vocab_size == REAL_VOCAB  # from universal_checkpoint_info
    assert (model.meta.iteration, model.meta.progress.consumed_train_samples) == (10, 80)
    # args.bias_gelu_fusion False, openai_gelu False: upstream's MLP ran F.gelu, the exact GeLU.
    assert model.config.activation == "gelu"
    assert_golden_logits(golden / "tp2-pp1-ckpt", golden)


def test_the_tanh_gelu_is_told_apart_from_upstream_s(golden):
    """The tolerance sees the GeLU: the same weights through the tanh GeLU miss it."""
    tokens = np.load(golden / "logits/fixed_tokens.npy")
    tanh = logits_of(golden / "tp2-pp1-ckpt", tokens, activation="gelu_tanh")
    expected = np.load(golden / "logits/logits_rows_0_1_64_127.npy")
    assert np.abs(tanh[LOGIT_ROWS, :REAL_VOCAB].numpy() - expected).max() > 1.5 * LOGIT_ATOL


def test_merge_mp_reshapes_and_verifies_upstream_checkpoint(merge_mp, golden, tmp_path):
    out = tmp_path / "tp1"
    result = merge_mp(
        "--load", golden / "tp2-pp1-ckpt", "--save", out,
        "--target-tensor-model-parallel-size", "1", "--target-pipeline-model-parallel-size", "1",
        "--verify",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert_golden_logits(out, golden)
    # TP=1 keeps the 50432 rows TP=2 padded to (not TP=1's 50304): the trained padding rows stay
    # in the softmax, so the loss on --verify's batch is the source's to the bit.
    line = result.stdout.splitlines()[-1]
    assert line.startswith(
        "verify: largest logit difference 0; loss on 2 x 32 random token ids (not text) "
    )
    assert line.endswith("(the source's too)"), line


def test_a_missing_latest_reads_the_global_step_the_iteration_file_names(
    merge_mp, golden, tmp_path
):
    """Megatron-DeepSpeed writes `latest` (global_step10) and latest_checkpointed_iteration.txt
    (10) side by side; with `latest` gone the iteration file's global_step10 is the checkpoint
    (not an iter_0000010 that was never written), for every reader: locate (mds-train's
    find_checkpoint), load_consolidated, mds-merge-mp."""
    copy = tmp_path / "ckpt"
    shutil.copytree(golden / "tp2-pp1-ckpt", copy)
    (copy / "latest").unlink()
    assert locate_checkpoint(copy) == Located(copy / "global_step10", "deepspeed")
    assert_golden_logits(copy, golden)
    result = merge_mp(
        "--load", copy, "--save", tmp_path / "tp1", "--target-tensor-model-parallel-size", "1"
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert_golden_logits(tmp_path / "tp1", golden)


@pytest.mark.parametrize("other", ["global_step8", "iter_0000008"])
def test_an_iteration_file_naming_no_folder_says_what_is_there(merge_mp, tmp_path, other):
    save = tmp_path / "ckpt"
    (save / other).mkdir(parents=True)
    (save / "latest_checkpointed_iteration.txt").write_text("10")
    result = merge_mp("--load", save, "--save", tmp_path / "out")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == (
        f"mds-merge-mp: error: {save / 'latest_checkpointed_iteration.txt'}: names "
        f"iteration 10, but {save} holds neither iter_0000010 nor global_step10; write the "
        f"iteration of a checkpoint folder into it (the newest is {other}), or give that folder "
        "itself\n"
    )


def test_a_reshape_carries_upstream_s_scheduler_state(merge_mp, golden, golden_states, tmp_path):
    """Upstream's resume hands the rank file's `lr_scheduler` to its scheduler's load_state_dict
    (a None stops it: `argument of type 'NoneType' is not iterable`); a reshaped output carries the
    source's, progress included, with and without --with-optimizer."""
    for flags in ([], ["--with-optimizer"]):
        out = tmp_path / f"tp1{len(flags)}"
        result = merge_mp(
            "--load", golden / "tp2-pp1-ckpt", "--save", out,
            "--target-tensor-model-parallel-size", "1", *flags,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        state = torch.load(out / "global_step10" / "mp_rank_00_model_states.pt", weights_only=False)
        assert state["lr_scheduler"] == golden_states[0]["lr_scheduler"]


def _layer_states(module: dict) -> tuple[dict, list[dict], dict]:
    """A rank's nested module as GPTModelPipe's layers hold it: embedding, layers, final norm."""
    language = module["language_model"]
    embedding = {
        f"{sub}.weight": language["embedding"][sub]["weight"] for sub in language["embedding"]
    }
    encoder = language["encoder"]
    count = 1 + max(int(name.split(".")[1]) for name in encoder if name.startswith("layers."))
    layers = [
        {name.split(".", 2)[2]: t for name, t in encoder.items() if name.startswith(f"layers.{i}.")}
        for i in range(count)
    ]
    final = {name.split(".", 1)[1]: t for name, t in encoder.items() if name.startswith("final_")}
    return embedding, layers, final


@pytest.mark.parametrize("numbering", ["deepspeedai", "bigscience"])
def test_pipeline_layer_files_of_either_fork_give_upstream_logits(
    golden, golden_states, tmp_path, numbering
):
    folder = tmp_path / "ckpt" / "global_step10"
    folder.mkdir(parents=True)
    gap = {"deepspeedai": 1, "bigscience": 2}[numbering]
    for tp, state in enumerate(golden_states):
        embedding, layers, final = _layer_states(state["module"])
        indices = [1, *range(1 + gap, 1 + gap + len(layers)), len(layers) + 2 * gap]
        for index, layer in zip(indices, [embedding, *layers, final], strict=True):
            torch.save(layer, folder / f"layer_{index:02d}-model_{tp:02d}-model_states.pt")
        client = {key: value for key, value in state.items() if key != "module"}
        torch.save({**client, "module": None}, folder / f"mp_rank_{tp:02d}_model_states.pt")
    (folder.parent / "latest").write_text("global_step10")
    assert_golden_logits(folder.parent, golden)


def _with_qkv_order(module: dict, order: str, heads: int) -> dict:
    """The module with each QKV weight and bias in `order` (from the golden's per-head rows)."""
    module = copy.deepcopy(module)
    encoder = module["language_model"]["encoder"]
    for name, tensor in encoder.items():
        if "query_key_value" in name:
            grouped = tensor.view(heads, 3, -1, *tensor.shape[1:])  # [np, 3, hn]
            axes = {"blocks": (0, 1), "head_dim_first": (1, 2)}[order]
            encoder[name] = grouped.transpose(*axes).reshape(tensor.shape).contiguous()
    return module


def _megatron_folder(tmp_path: Path, golden_states: list[dict], modules: list[dict], **client):
    base = tmp_path / "megatron"
    for tp, (state, module) in enumerate(zip(golden_states, modules, strict=True)):
        folder = base / "iter_0000010" / f"mp_rank_{tp:02d}"
        folder.mkdir(parents=True)
        saved = {"model": module, "args": state["args"], "iteration": 10, **client}
        torch.save(saved, folder / "model_optim_rng.pt")
    (base / "latest_checkpointed_iteration.txt").write_text("10")
    return base


def test_plain_megatron_files_give_upstream_logits(golden, golden_states, tmp_path):
    modules = [state["module"] for state in golden_states]
    base = _megatron_folder(tmp_path, golden_states, modules, checkpoint_version=3.0)
    assert_golden_logits(base, golden)


@pytest.mark.parametrize(
    "version, order", [(0, "blocks"), (1.0, "head_dim_first"), (None, "blocks")]
)
def test_older_checkpoint_versions_are_reordered_as_megatron_does(
    golden, golden_states, tmp_path, version, order
):
    """Megatron reads a missing checkpoint_version as 0 (`get_checkpoint_version` is 0 until a
    file sets it), so a file without one is reordered as version 0."""
    heads = golden_states[0]["args"].num_attention_heads // 2
    modules = [_with_qkv_order(state["module"], order, heads) for state in golden_states]
    client = {} if version is None else {"checkpoint_version": version}
    base = _megatron_folder(tmp_path, golden_states, modules, **client)
    assert_golden_logits(base, golden)


def test_fpdt_commits_qkv_blocks_are_told_by_their_args(golden, golden_states, tmp_path):
    """From commit 676a482 upstream's rows are [Q|K|V] blocks at checkpoint_version 3.0; only
    the ds_sequence_parallel_fpdt* arguments it added tell such a file apart."""
    heads = golden_states[0]["args"].num_attention_heads // 2
    folder = tmp_path / "fpdt" / "global_step10"
    folder.mkdir(parents=True)
    for tp, state in enumerate(golden_states):
        args = argparse.Namespace(**vars(state["args"]))
        args.ds_sequence_parallel_fpdt = False
        args.ds_sequence_parallel_fpdt_chunk_size = 65536
        args.ds_sequence_parallel_fpdt_offloading = False
        saved = {**state, "args": args, "module": _with_qkv_order(state["module"], "blocks", heads)}
        torch.save(saved, folder / f"mp_rank_{tp:02d}_model_states.pt")
    assert_golden_logits(folder, golden)
    # The same rows read as per-head (what mds did before) are not upstream's model.
    for tp, state in enumerate(golden_states):
        saved = {**state, "module": _with_qkv_order(state["module"], "blocks", heads)}
        torch.save(saved, folder / f"mp_rank_{tp:02d}_model_states.pt")
    with pytest.raises(AssertionError):
        assert_golden_logits(folder, golden)


def test_a_file_whose_qkv_order_cannot_be_told_is_refused(golden, golden_states, tmp_path):
    folder = tmp_path / "ckpt" / "global_step10"
    shutil.copytree(golden / "tp2-pp1-ckpt/global_step10", folder)
    for tp, state in enumerate(golden_states):
        torch.save({**state, "args": None}, folder / f"mp_rank_{tp:02d}_model_states.pt")
    with pytest.raises(ValueError, match="Megatron's args") as error:
        load_consolidated(folder)
    assert "\n" not in str(error.value)


def test_mds_generate_samples_upstream_s_greedy_tokens(golden, shared_data):
    """Upstream's own greedy continuation of its README prompt (upstream_eval.json), from the
    upstream checkpoint with GPT-2's files."""
    from mds_generate import GenerationConfig, Generator, ModelSource, Sampler, SamplingConfig
    from mds_generate import load as load_model
    from mds_tokenize import TokenizerSpec

    expected = json.loads((golden / "logits/upstream_eval.json").read_text())
    tokenizer = TokenizerSpec(
        vocab_file=shared_data / "gpt2-vocab.json", merge_file=shared_data / "gpt2-merges.txt"
    )
    loaded = load_model(
        ModelSource(load=golden / "tp2-pp1-ckpt", tokenizer=tokenizer, device="cpu")
    )
    prompt = loaded.tokenizer.encode(expected["prompt_text"])
    assert prompt == expected["prompt_text_ids"]
    new = len(expected["greedy_text_ids"])
    sampler = Sampler(SamplingConfig(greedy=True), vocab_size=REAL_VOCAB, device=loaded.device)
    generation = GenerationConfig(max_new_tokens=new, stop_at_eod=False)
    generator = Generator(loaded.model, loaded.tokenizer, device=loaded.device)
    [completion] = generator.generate([prompt], sampler=sampler, generation=generation)
    assert list(completion.token_ids) == expected["greedy_text_ids"]


def test_export_hf_of_upstream_checkpoint_gives_upstream_logits_in_transformers(
    merge_mp, golden, tmp_path
):
    import transformers

    """transformers' GPT-2 with activation_function "gelu" (its exact GeLU, as upstream's
    F.gelu) gives upstream's logits; import-hf of that folder reads the exact GeLU back."""
    result = merge_mp("export-hf", "--load", golden / "tp2-pp1-ckpt", "--save", tmp_path / "hf")
    assert result.returncode == 0, result.stderr
    model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    assert model.config.activation_function == "gelu"
    tokens = torch.from_numpy(np.load(golden / "logits/fixed_tokens.npy")[:128].astype(np.int64))
    with torch.no_grad():
        logits = model(tokens[None]).logits[0]
    expected = np.load(golden / "logits/logits_rows_0_1_64_127.npy")
    np.testing.assert_allclose(logits[LOGIT_ROWS].numpy(), expected, rtol=0, atol=LOGIT_ATOL)
    imported = tmp_path / "imported"
    result = merge_mp("import-hf", "--load", tmp_path / "hf", "--save", imported)
    assert result.returncode == 0, result.stderr
    assert load_consolidated(imported).config.activation == "gelu"
    assert_golden_logits(imported, golden)


def upstream_command_line(golden: Path, shared_data: Path, cache: Path) -> list[str]:
    """The golden README's pretrain_gpt.py flags, paths changed (the data cache to this test's)."""
    return [
        *"--num-layers 2 --hidden-size 16 --num-attention-heads 4 --seq-length 128".split(),
        *"--max-position-embeddings 128 --micro-batch-size 4 --global-batch-size 8".split(),
        *"--lr 1e-2 --min-lr 1e-3 --lr-decay-style cosine --lr-decay-iters 20".split(),
        *"--lr-warmup-iters 2".split(),
        *"--weight-decay 0.01 --clip-grad 1.0 --adam-beta1 0.9 --adam-beta2 0.95".split(),
        *"--adam-eps 1e-8 --init-method-std 0.02 --hidden-dropout 0 --attention-dropout 0".split(),
        *("--seed", "1234", "--data-path", str(golden / "upstream_train_text_document")),
        *("--vocab-file", str(shared_data / "gpt2-vocab.json")),
        *("--merge-file", str(shared_data / "gpt2-merges.txt")),
        *"--split 949,50,1 --log-interval 1 --eval-interval 1000 --eval-iters 1".split(),
        *"--distributed-backend gloo --tensor-model-parallel-size 2".split(),
        *"--pipeline-model-parallel-size 1 --no-pipeline-parallel".split(),
        *("--save-interval", "10", "--data-cache-path", str(cache)),
        *("--deepspeed", "--deepspeed_config", str(golden / "ds_zero1.json")),
        *"--zero-stage 1 --cpu-optimizer --cpu_torch_adam".split(),
        *"--no-masked-softmax-fusion --no-bias-gelu-fusion --no-bias-dropout-fusion".split(),
        "--no-gradient-accumulation-fusion",
    ]


@pytest.mark.multiprocess
@pytest.mark.parametrize("tensor_parallel", [2, 1])
def test_mds_train_continues_upstream_s_run_exactly(
    runs, golden, shared_data, data_cache, tmp_path, tensor_parallel
):
    """Upstream resumed its own checkpoint to iteration 11 (logs/tp2_resume11.log): lm loss
    9.183857, learning rate 5.500E-03; to iteration 12 (upstream's code at 6acc370a, run by hand
    as the golden's README says, `--train-iters 12`): lm loss 9.022314 at learning rate
    4.719E-03, which follows from the Adam moments of its ZeRO-1 partitions, and validation
    9.114842 at its end.
    mds-train --load of that checkpoint with upstream's command line logs the same (rel 1e-6: the
    log prints 7 digits). At upstream's TP=2 DeepSpeed loads upstream's files as they are (ZeRO
    partitions and RNG states included); at TP=1 they are converted first, and the padded
    vocabulary keeps upstream's 50432 trained rows (TP=1 alone would pad to 50304, and the loss
    would move by the dropped rows' share, -2.4e-3)."""
    flags = upstream_command_line(golden, shared_data, data_cache)
    flags[flags.index("--tensor-model-parallel-size") + 1] = str(tensor_parallel)
    save = tmp_path / "save"
    flags += ["--train-iters", "12", "--load", str(golden / "tp2-pp1-ckpt"), "--save", str(save)]
    flags += ["--use-checkpoint-opt_param-scheduler"]  # as upstream's resume (the README's)
    result = runs.train(flags, nproc=tensor_parallel)
    assert result.returncode == 0, result.stderr[-3000:]
    as_they_are = "Megatron-DeepSpeed's files at this run's layout, loaded as they are"
    assert (as_they_are in result.stderr) == (tensor_parallel == 2)
    records = [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]
    train = {r["iteration"]: r for r in records if r["event"] == "train"}
    assert sorted(train) == [11, 12]
    assert train[11]["lm_loss"] == pytest.approx(9.183857, rel=1e-6)
    assert train[11]["learning_rate"] == pytest.approx(5.5e-3, rel=1e-12)
    assert train[12]["lm_loss"] == pytest.approx(9.022314, rel=1e-6)
    [valid] = [r for r in records if r["event"] == "validation"]
    assert valid["iteration"] == 12 and valid["lm_loss"] == pytest.approx(9.114842, rel=1e-6)
    assert "leaves 0 of its 325 documents for test; no test samples" in result.stderr
    assert (
        json.loads((save / "global_step12/meta.json").read_text())["model"]["padded_vocab_size"]
        == 50432
    )
    assert sorted(path.name for path in save.iterdir() if path.name.startswith(".")) == []


@pytest.mark.parametrize(
    ("scheduler_flag", "learning_rate"),
    [
        # The checkpoint's max_lr 0.01: cosine at 88 of 160 samples, warmup 16, as upstream logs.
        ("--use-checkpoint-opt_param-scheduler", 5.5e-3),
        # The flags' --lr 2e-2: 1e-3 + (2e-2 - 1e-3) x 0.5 (cos(pi x 72 / 144) + 1).
        ("--override-opt_param-scheduler", 1e-3 + (2e-2 - 1e-3) * 0.5),
    ],
)
def test_the_scheduler_flags_choose_the_checkpoint_s_schedule_or_the_flags(
    runs, golden, shared_data, data_cache, tmp_path, scheduler_flag, learning_rate
):
    """Upstream's OptimizerParamScheduler.load_state_dict: --use-checkpoint-opt_param-scheduler
    keeps the checkpoint's recorded schedule (its lr_scheduler dict), --override-opt_param-scheduler
    takes the flags'; progress (num_steps 80) comes from the checkpoint either way. Iteration 11's
    loss is computed before its step, so it is upstream's in both."""
    flags = upstream_command_line(golden, shared_data, data_cache)
    flags[flags.index("--tensor-model-parallel-size") + 1] = "1"
    flags[flags.index("--lr") + 1] = "2e-2"
    save = tmp_path / "save"
    flags += ["--train-iters", "11", "--load", str(golden / "tp2-pp1-ckpt"), "--save", str(save)]
    result = runs.train([*flags, scheduler_flag])
    assert result.returncode == 0, result.stderr[-3000:]
    [train] = runs.train_records(save)
    assert train["lm_loss"] == pytest.approx(9.183857, rel=1e-6)
    assert train["learning_rate"] == pytest.approx(learning_rate, rel=1e-12)


def test_a_schedule_that_differs_from_the_checkpoint_s_is_one_line(
    runs, golden, shared_data, data_cache, tmp_path
):
    """Neither flag: upstream asserts the flags' values equal the checkpoint's; mds-train says
    which value differs, both sides, and the two flags that settle it."""
    flags = upstream_command_line(golden, shared_data, data_cache)
    flags[flags.index("--tensor-model-parallel-size") + 1] = "1"
    flags[flags.index("--lr") + 1] = "2e-2"
    save = tmp_path / "save"
    flags += ["--train-iters", "11", "--load", str(golden / "tp2-pp1-ckpt"), "--save", str(save)]
    result = runs.train(flags)
    assert result.returncode == 1
    [line] = [line for line in result.stderr.splitlines() if "error" in line]
    assert line.startswith("mds-train: error: ") and "max_lr 0.01, the flags give 0.02" in line
    assert (
        "--use-checkpoint-opt_param-scheduler" in line and "--override-opt_param-scheduler" in line
    )
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "name, value, what",
    [
        # args that describe another model than the files hold: refused by the tensors' names
        ("use_rotary_position_embeddings", True, "unexpected embedding.position_embeddings"),
        ("untie_embeddings_and_output_weights", True, "lacks output_layer.weight"),
        ("add_bias_linear", False, "unexpected layers.0.self_attention.query_key_value.bias"),
        ("num_experts", [2], "mixture of experts"),
    ],
)
def test_args_that_do_not_describe_the_files_are_refused(
    golden, golden_states, tmp_path, name, value, what
):
    """A model upstream's args describe as something the files do not hold (or mds does not
    build) is refused in one line, not read as the GPT it is not."""
    folder = tmp_path / "ckpt" / "global_step10"
    folder.mkdir(parents=True)
    for tp, state in enumerate(golden_states):
        args = argparse.Namespace(**{**vars(state["args"]), name: value})
        torch.save({**state, "args": args}, folder / f"mp_rank_{tp:02d}_model_states.pt")
    with pytest.raises(ValueError, match=what) as error:
        load_consolidated(folder)
    assert "\n" not in str(error.value) and str(folder) in str(error.value)


def test_plain_megatron_s_recorded_schedule_is_checked_too(
    runs, golden, golden_states, shared_data, data_cache, tmp_path
):
    """Plain Megatron keeps the schedule under `opt_param_scheduler` in model_optim_rng.pt
    (megatron/checkpointing.py save_checkpoint); a run whose flags differ from it is refused as
    for DeepSpeed's files."""
    modules = [state["module"] for state in golden_states]
    base = _megatron_folder(
        tmp_path, golden_states, modules, checkpoint_version=3.0,
        opt_param_scheduler=golden_states[0]["lr_scheduler"],
    )  # fmt: skip
    flags = upstream_command_line(golden, shared_data, data_cache)
    flags[flags.index("--tensor-model-parallel-size") + 1] = "1"
    flags[flags.index("--lr") + 1] = "2e-2"
    flags += ["--train-iters", "11", "--load", str(base), "--save", str(tmp_path / "save")]
    result = runs.train(flags)  # its optimizer state is not read: one line says what to add
    assert result.returncode == 1
    [line] = [line for line in result.stderr.splitlines() if "error" in line]
    assert "optimizer state (`optimizer` in model_optim_rng.pt) is not read yet" in line
    assert "--no-load-optim" in line
    result = runs.train([*flags, "--no-load-optim"])
    assert result.returncode == 1
    [line] = [line for line in result.stderr.splitlines() if "error" in line]
    assert "max_lr 0.01, the flags give 0.02" in line, result.stderr[-2000:]


def test_upstream_s_rng_states_restore_into_mds_s_tracker(golden_states):
    """Upstream's `rng_state` (megatron/checkpointing.py `get_rng_state`), as mds-train restores
    it for a run that loads upstream's files as they are (state.restore_upstream_rng_state, the
    order of upstream's load_checkpoint) and writes it back (state.upstream_rng_state): every
    generator as upstream saved it, the tracker's under Megatron's name. (Not compared with a
    fresh seed: upstream's weight init draws from the model-parallel state, mds's from seeds of
    its own.)"""
    import random

    from mds_model import model_parallel_seed
    from mds_train.state import restore_upstream_rng_state, upstream_rng_state

    saved = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    try:
        for tp, state in enumerate(golden_states):
            (theirs,) = state["rng_state"]
            tracker = model_parallel_seed(1234, tp_rank=tp)
            restore_upstream_rng_state(state["rng_state"], tracker)
            (ours,) = upstream_rng_state(tracker)
            assert ours["random_rng_state"] == theirs["random_rng_state"]
            for key in ("torch_rng_state", "cuda_rng_state"):
                assert torch.equal(ours[key], theirs[key]), key
            assert all(
                np.array_equal(a, b)
                for a, b in zip(ours["np_rng_state"], theirs["np_rng_state"], strict=True)
            )
            assert list(ours["rng_tracker_states"]) == ["model-parallel-rng"]
            assert torch.equal(
                ours["rng_tracker_states"]["model-parallel-rng"],
                theirs["rng_tracker_states"]["model-parallel-rng"],
            )
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        torch.set_rng_state(saved[2])
