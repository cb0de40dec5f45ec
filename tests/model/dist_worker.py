"""Worker for the multi-process model tests, launched by torchrun over gloo (CPU, fp32).

Modes (argv[1], comma-separated: run one after another in the same processes, since each start-up
of torch and DeepSpeed costs seconds); each rank writes `<mode>/rank{r}.json` under argv[2] with
max abs differences:
  tp    TP=2 vs TP=1: logits, loss and every parameter gradient, for several position types.
  pp    PP=2 (DeepSpeed pipeline engine, 2 micro-batches) vs the plain GPT: loss and every gradient,
        then `save_checkpoint` into argv[2]/pp/ckpt so the test can read the file names and keys.
  tppp  TP=2 x PP=2 (4 ranks) vs the plain GPT, as pp.
  llama     TP=2 Llama (grouped-query attention, SwiGLU, RMSNorm, untied head, sequence
            parallelism, recompute) vs transformers' LlamaForCausalLM: logits, loss, gradients.
  llama_pp  PP=2 Llama through DeepSpeed's pipeline engine vs LlamaForCausalLM, as pp.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from mds_model.config import ARCHITECTURES, GPTConfig, for_tensor_parallel
from mds_model.gpt import GPT, masked_mean
from mds_model.naming import split_of
from mds_model.parallel import ParallelGroups
from mds_model.rng import model_parallel_seed

VOCAB, SEQ, BATCH = 250, 12, 3  # 250 pads to 256 at TP=1 and TP=2 with divisible_by 64


def tiny_config(tp: int, **overrides) -> GPTConfig:
    base = dict(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        vocab_size=VOCAB,
        seq_length=SEQ,
        make_vocab_size_divisible_by=64,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_fused_kernels=False,
    )
    base.update(overrides)
    return for_tensor_parallel(GPTConfig(**base), tp)


def batch(seed: int, batch_size: int = BATCH):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (batch_size, SEQ), generator=gen)
    labels = torch.randint(0, VOCAB, (batch_size, SEQ), generator=gen)
    loss_mask = (torch.rand(batch_size, SEQ, generator=gen) > 0.2).float()
    return tokens, labels, loss_mask


def local_slice(
    full: torch.Tensor, name: str, config: GPTConfig, groups: ParallelGroups
) -> torch.Tensor:
    """The part of a TP=1 tensor that this rank's parameter `name` holds (the parameter table's
    split: a gated MLP's rank holds a block of each half)."""
    split = split_of(name, config)
    if split.dim is None:
        return full
    blocks = split.rank_blocks(full.shape[split.dim], groups.tp_size, groups.tp_rank)
    return torch.cat([full.narrow(split.dim, a, b - a) for a, b in blocks], dim=split.dim)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a.double() - b.double()).abs().max().item()


def run_tp(out: Path) -> dict:
    groups = ParallelGroups.build(tensor_parallel_size=2)
    results = {}
    variants = {
        "learned": {},
        "alibi_embed_layernorm": {"position_embedding_type": "alibi", "embed_layernorm": True},
        "rotary_selective": {
            "position_embedding_type": "rotary",
            "activation_checkpointing": "selective",
        },
        "learned_full_ckpt": {"activation_checkpointing": "full"},
        "sequence_parallel": {"sequence_parallel": True},
        "sequence_parallel_alibi_selective": {
            "sequence_parallel": True,
            "position_embedding_type": "alibi",
            "embed_layernorm": True,
            "activation_checkpointing": "selective",
        },
    }
    for name, overrides in variants.items():
        ref = GPT(tiny_config(1, **overrides), init_seed=7)
        par = GPT(tiny_config(2, **overrides), groups=groups, init_seed=7)
        tokens, labels, loss_mask = batch(11)
        ref_logits = ref.logits(tokens)
        par_logits = par.gather_logits(par.logits(tokens))
        ref_loss = masked_mean(ref(tokens, labels), loss_mask)
        par_loss = masked_mean(par(tokens, labels), loss_mask)
        ref_loss.backward()
        par_loss.backward()
        ref_params = dict(ref.named_parameters())
        cfg = par.config
        grad_diffs = {
            pname: max_diff(p.grad, local_slice(ref_params[pname].grad, pname, cfg, groups))
            for pname, p in par.named_parameters()
        }
        weight_diffs = [
            max_diff(p, local_slice(ref_params[n], n, cfg, groups))
            for n, p in par.named_parameters()
        ]
        results[name] = {
            "logits": max_diff(ref_logits, par_logits),
            "loss": abs(ref_loss.item() - par_loss.item()),
            "grads": grad_diffs,
            "weights": max(weight_diffs),
            "num_params": len(grad_diffs),
        }
    results["dropout"] = run_tp_dropout(groups, sequence_parallel=False)
    results["dropout_sequence_parallel"] = run_tp_dropout(groups, sequence_parallel=True)
    return results


def _across_ranks(x: torch.Tensor, group) -> float:
    """Max abs difference of x between the ranks of group."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return max(max_diff(parts[0], p) for p in parts[1:])


def run_tp_dropout(groups: ParallelGroups, *, sequence_parallel: bool) -> dict:
    """With dropout on, replicated activations and gradients stay identical on TP ranks while the
    attention dropout (inside the TP region) draws per-rank masks."""
    config = tiny_config(
        2, hidden_dropout=0.2, attention_dropout=0.2, sequence_parallel=sequence_parallel
    )
    tracker = model_parallel_seed(99, tp_rank=groups.tp_rank)
    model = GPT(config, groups=groups, rng_tracker=tracker, init_seed=7).train()
    tokens, labels, loss_mask = batch(13)
    logits = model.gather_logits(model.logits(tokens))
    loss = masked_mean(model(tokens, labels), loss_mask)
    loss.backward()
    replicated = [
        p.grad.flatten()
        for p in model.parameters()
        if not getattr(p, "tensor_model_parallel", False)
    ]
    with tracker.fork():
        tracked_draw = torch.rand(16)
    # The same model with every rank on tp_rank 0's tracked seed: its output must differ, or the
    # per-rank attention dropout masks were not in use.
    same_seed = GPT(config, groups=groups, rng_tracker=model_parallel_seed(99), init_seed=7).train()
    return {
        "logits_across_ranks": _across_ranks(logits, groups.tp_group),
        "loss_across_ranks": _across_ranks(loss.detach().reshape(1), groups.tp_group),
        "replicated_grads_across_ranks": _across_ranks(torch.cat(replicated), groups.tp_group),
        "tracked_draws_across_ranks": _across_ranks(tracked_draw, groups.tp_group),
        "vs_shared_tracker_seed": max_diff(
            logits, same_seed.gather_logits(same_seed.logits(tokens))
        ),
    }


def _llama_bridge():
    """tests/model/llama_hf.py: our Llama's weights under transformers' names."""
    spec = importlib.util.spec_from_file_location(
        "llama_hf", Path(__file__).with_name("llama_hf.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LLAMA = dict(
    hidden_size=64,
    num_attention_heads=8,
    num_query_groups=2,
    ffn_hidden_size=96,
    rotary_base=500000.0,
)


def llama_config(tp: int, **overrides) -> GPTConfig:
    return tiny_config(tp, **{**ARCHITECTURES["llama"], **LLAMA, **overrides})


def hf_reference(config: GPTConfig, micro: list) -> tuple[float, dict, torch.Tensor, dict]:
    """LlamaForCausalLM holding the TP=1 Llama's initial weights (seed 5): its mean masked loss
    over the micro-batches, its gradients and weights under our names, and its logits of the
    first micro-batch."""
    bridge = _llama_bridge()
    ours = GPT(llama_config(1, num_layers=config.num_layers), init_seed=5)
    hf = bridge.hf_llama(ours.state_dict(), ours.config)
    total = 0.0
    for tokens, labels, mask in micro:
        logits = hf(tokens).logits
        losses = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none"
        )
        total = total + masked_mean(losses.view(labels.shape), mask)
    loss = total / len(micro)
    loss.backward()
    grads = bridge.from_hf_llama(bridge.hf_gradients(hf), ours.config)
    weights = bridge.from_hf_llama(dict(hf.named_parameters()), ours.config)
    with torch.no_grad():
        first_logits = hf(micro[0][0]).logits
    return loss.item(), grads, first_logits, {n: w.detach() for n, w in weights.items()}


def run_llama_tp(out: Path) -> dict:
    """TP=2 Llama (sequence parallel, selective recompute) against LlamaForCausalLM."""
    groups = ParallelGroups.build(tensor_parallel_size=2)
    config = llama_config(2, sequence_parallel=True, activation_checkpointing="selective")
    model = GPT(config, groups=groups, init_seed=5)
    micro = [batch(31)]
    ref_loss, ref_grads, ref_logits, ref_weights = hf_reference(config, micro)
    tokens, labels, mask = micro[0]
    logits = model.gather_logits(model.logits(tokens))
    loss = masked_mean(model(tokens, labels), mask)
    loss.backward()
    return {
        "logits": max_diff(logits, ref_logits),
        "loss": abs(loss.item() - ref_loss),
        "weights": max(
            max_diff(p, local_slice(ref_weights[n], n, config, groups))
            for n, p in model.named_parameters()
        ),
        "grads": {
            n: max_diff(p.grad, local_slice(ref_grads[n], n, config, groups))
            for n, p in model.named_parameters()
        },
    }


def pipe_param_name(name: str, num_layers: int) -> str:
    """PipelineModule parameter name -> plain GPT parameter name (deepspeedai/Megatron-DeepSpeed's
    GPTModelPipe numbering: the embedding at 1, the layers at 2..N+1, the final norm at N+2, an
    untied head at N+3)."""
    if name.startswith("tied_modules.embed."):
        return "embedding." + name[len("tied_modules.embed.") :]
    index, rest = name.split(".", 1)
    index = int(index)
    if index == 1:
        return f"embedding.{rest}"
    if 2 <= index < 2 + num_layers:
        return f"layers.{index - 2}.{rest}"
    if index == num_layers + 3:
        assert rest == "lm_head.weight", name
        return "output_layer.weight"
    assert index == num_layers + 2, name
    return f"final_layernorm.{rest}"


def run_pipe(out: Path, tp: int, llama: bool = False) -> dict:
    import deepspeed
    from mds_model.pipeline import build_gpt_pipe, pipeline_deepspeed_config

    groups = ParallelGroups.build(tensor_parallel_size=tp, pipeline_parallel_size=2)
    # Full activation checkpointing inside the pipeline engine (and sequence parallelism with TP);
    # the plain reference runs without either.
    make = llama_config if llama else tiny_config
    config = make(tp, num_layers=4, activation_checkpointing="full", sequence_parallel=tp > 1)
    pipe = build_gpt_pipe(config, groups=groups, rng_tracker=None, init_seed=5)
    optimizer = torch.optim.SGD(pipe.parameters(), lr=1.0)  # delta of one step = the gradient
    ds_config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "steps_per_print": 10**9,
        "gradient_clipping": 0.0,
        **pipeline_deepspeed_config(config),
    }
    engine, _, _, _ = deepspeed.initialize(model=pipe, optimizer=optimizer, config=ds_config)
    micro = [batch(21 + i, batch_size=2) for i in range(2)]
    before = {n: p.detach().clone() for n, p in pipe.named_parameters()}
    data = iter([(tokens, (labels, mask)) for tokens, labels, mask in micro])
    pipe_loss = engine.train_batch(data_iter=data).item()

    if llama:  # transformers' model is the reference
        ref_loss, ref_grads, _, ref_weights = hf_reference(config, micro)
    else:
        ref = GPT(tiny_config(1, num_layers=4), init_seed=5)
        loss = sum(masked_mean(ref(t, lab), m) for t, lab, m in micro) / len(micro)
        loss.backward()
        ref_loss = loss.item()
        ref_weights = {n: p.detach() for n, p in ref.named_parameters()}
        ref_grads = {n: p.grad for n, p in ref.named_parameters()}
    weight_diffs, grad_diffs = {}, {}
    for name, p in pipe.named_parameters():
        if groups.pp_rank > 0 and name.startswith("tied_modules.embed.position_embeddings"):
            continue  # the last stage's embedding copy only lends its word embeddings to the head
        plain = pipe_param_name(name, config.num_layers)
        weight_diffs[name] = max_diff(
            before[name], local_slice(ref_weights[plain], plain, config, groups)
        )
        grad_diffs[name] = max_diff(
            before[name] - p.detach(), local_slice(ref_grads[plain], plain, config, groups)
        )
    engine.save_checkpoint(str(out / "ckpt"), tag="global_step1")
    return {
        "loss": abs(pipe_loss - ref_loss),
        "pipe_loss": pipe_loss,
        "weights": max(weight_diffs.values()),
        "grads": grad_diffs,
        "stage": groups.pp_rank,
        "tp_rank": groups.tp_rank,
    }


RUNS = {
    "tp": run_tp,
    "llama": run_llama_tp,
    "pp": lambda out: run_pipe(out, tp=1),
    "tppp": lambda out: run_pipe(out, tp=2),
    "llama_pp": lambda out: run_pipe(out, tp=1, llama=True),
}


def main() -> None:
    import deepspeed

    modes, out = sys.argv[1].split(","), Path(sys.argv[2])
    deepspeed.init_distributed(dist_backend="gloo")
    for mode in modes:
        torch.manual_seed(0)  # each mode starts from the same state, as in a process of its own
        folder = out / mode
        folder.mkdir(parents=True, exist_ok=True)
        result = RUNS[mode](folder)
        (folder / f"rank{dist.get_rank()}.json").write_text(json.dumps(result, indent=1))
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
