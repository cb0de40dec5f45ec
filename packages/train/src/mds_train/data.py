"""Training batches from mds-index datasets, handed out as Megatron's pretraining sampler does.

Samples are taken in order from `consumed_samples` on, in chunks of micro_batch x DP; data-parallel
rank r takes positions [r*mb, (r+1)*mb) of each chunk (README: "Batches"). Tensor- and pipeline-
parallel ranks of one replica read the same samples. Index caches are built once by global rank 0
(or ahead of time with `mds-index build`) and only read by the others.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from mds_indexed_data import GPTDataConfig, build_train_valid_test_datasets

from .config import Topology, TrainConfig

EOD_TOKEN = "<|endoftext|>"


@dataclass(frozen=True)
class Vocabulary:
    size: int
    eod_id: int
    vocab_file: str
    merge_file: str | None


def read_vocabulary(vocab_file: Path, merge_file: Path | None) -> Vocabulary:
    """Vocabulary size and end-of-document id from a GPT-2 style vocab.json."""
    try:
        vocab = json.loads(Path(vocab_file).read_text(encoding="utf-8"))
    except OSError as error:
        raise ValueError(f"{vocab_file}: cannot read --vocab-file ({error.strerror})") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{vocab_file}:{error.lineno}: --vocab-file is not JSON") from None
    if not isinstance(vocab, dict) or not vocab:
        raise ValueError(f"{vocab_file}: --vocab-file must be a JSON object of token -> id")
    if merge_file is not None and not Path(merge_file).is_file():
        raise ValueError(f"{merge_file}: --merge-file does not exist")
    if EOD_TOKEN not in vocab:
        raise ValueError(f"{vocab_file}: no {EOD_TOKEN} token; it marks document ends")
    return Vocabulary(
        size=max(vocab.values()) + 1,
        eod_id=int(vocab[EOD_TOKEN]),
        vocab_file=str(Path(vocab_file).resolve()),
        merge_file=str(Path(merge_file).resolve()) if merge_file else None,
    )


def requested_samples(config: TrainConfig, topology: Topology, train_iters: int) -> tuple:
    """(train, valid, test) sample counts, as Megatron's build_train_valid_test_data_iterators."""
    gbs = config.global_batch_size(topology)
    eval_iters, eval_interval = config.logging.eval_iters, config.logging.eval_interval
    train = config.batch.train_samples or train_iters * gbs
    valid = (train_iters // eval_interval + 1) * eval_iters * gbs
    return train, valid, eval_iters * gbs


def build_datasets(
    config: TrainConfig,
    topology: Topology,
    *,
    train_iters: int,
    rank: int,
    barrier: Callable[[], None],
):
    """The DatasetsBuild of mds-index; rank 0 builds missing caches, the others wait and read."""
    data_config = GPTDataConfig.from_data_path(
        config.data.data_path,
        seq_length=config.model.seq_length,
        num_samples=requested_samples(config, topology, train_iters),
        split=config.data.split,
        seed=config.precision.seed,
        cache_dir=config.data.data_cache_path,
    )
    if rank == 0:
        build = build_train_valid_test_datasets(data_config, build_missing=True)
        barrier()
    else:
        barrier()
        build = build_train_valid_test_datasets(data_config, build_missing=False)
    return build


def sample_positions(
    *, start: int, end: int, micro_batch_size: int, dp_rank: int, dp_size: int
) -> Iterator[range]:
    """Megatron's MegatronPretrainingSampler: this rank's positions of each whole chunk."""
    chunk = micro_batch_size * dp_size
    for first in range(start, end - chunk + 1, chunk):
        begin = first + dp_rank * micro_batch_size
        yield range(begin, begin + micro_batch_size)


class MicroBatches:
    """Iterates (tokens, labels, loss_mask) micro-batches of one rank from a sample position on.

    tokens/labels are (mb, S) int64 (labels shifted by one), loss_mask (mb, S) float: 0 where the
    input token is end-of-document with --eod-mask-loss, as Megatron's get_ltor_masks.
    """

    def __init__(
        self,
        dataset,
        *,
        consumed_samples: int,
        micro_batch_size: int,
        dp_rank: int,
        dp_size: int,
        device: torch.device,
        eod_mask_id: int | None,
    ) -> None:
        self.dataset = dataset
        self.device = device
        self.eod_mask_id = eod_mask_id
        self._positions = sample_positions(
            start=consumed_samples,
            end=len(dataset),
            micro_batch_size=micro_batch_size,
            dp_rank=dp_rank,
            dp_size=dp_size,
        )

    def __iter__(self) -> MicroBatches:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        positions = next(self._positions, None)
        if positions is None:
            raise StopIteration
        samples = torch.from_numpy(np.stack([self.dataset[i] for i in positions]))  # (mb, S+1)
        if self.device.type == "cuda":
            # From pageable memory the copy would make the host wait for the device's queue.
            samples = samples.pin_memory()
        samples = samples.to(self.device, non_blocking=True)
        tokens, labels = samples[:, :-1], samples[:, 1:]
        loss_mask = torch.ones(tokens.shape, dtype=torch.float32, device=self.device)
        if self.eod_mask_id is not None:
            loss_mask[tokens == self.eod_mask_id] = 0.0
        return tokens, labels, loss_mask


def pipeline_batches(batches: Iterator) -> Iterator:
    """The pipeline engine's shape of a micro-batch: (inputs, (labels, loss_mask))."""
    for tokens, labels, loss_mask in batches:
        yield tokens, (labels, loss_mask)
