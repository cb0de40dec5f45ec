"""Training batches from mds-index datasets, handed out as Megatron's pretraining sampler does.

Samples are taken in order from `consumed_samples` on, in chunks of micro_batch x DP; data-parallel
rank r takes positions [r*mb, (r+1)*mb) of each chunk (README: "Batches"). Tensor- and pipeline-
parallel ranks of one replica read the same samples. Index caches are built once by global rank 0
(or ahead of time with `mds-index build`) and only read by the others.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from mds_common.tokenizer_record import TokenizerRecord
from mds_indexed_data import GPTDataConfig, build_train_valid_test_datasets
from mds_tokenize import load_tokenizer

from .config import DataSection, Topology, TrainConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Vocabulary:
    record: TokenizerRecord  # the tokenizer's own (mds_tokenize.interface), as sidecars hold it
    eod_id: int

    @property
    def size(self) -> int:
        """Embedding rows before padding: every id of the tokenizer fits."""
        return self.record.embedding_rows()

    def meta_record(self) -> TokenizerRecord:
        """meta.json's `tokenizer`: the record with the size trained on and the EOD used."""
        return self.record.updated(vocab_size=self.size, eod_id=self.eod_id)


def read_vocabulary(data: DataSection) -> Vocabulary:
    """Vocabulary size and end-of-document id of the tokenizer the flags name (GPT-2 files or a
    Hugging Face tokenizer.json), through mds_tokenize's one interface."""
    tokenizer = load_tokenizer(
        tokenizer_type=data.tokenizer_type,
        vocab_file=data.vocab_file,
        merge_file=data.merge_file,
        tokenizer_name_or_path=data.tokenizer_name_or_path,
        eod_token=data.eod_token,
        tokenizer_model=data.tokenizer_model,
    )
    return Vocabulary(
        record=tokenizer.record(),
        eod_id=tokenizer.eod,  # ValueError saying how to name one when there is none
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
        build = build_train_valid_test_datasets(
            data_config, build_missing=True, skip_empty_eval_splits=True
        )
        barrier()
        for line in build.skipped:
            logger.warning("%s", line)
    else:
        barrier()
        build = build_train_valid_test_datasets(
            data_config, build_missing=False, skip_empty_eval_splits=True
        )
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
