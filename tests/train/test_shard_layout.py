"""ZeRO-1/2's cut of a flat parameter group (mds_train.shard_layout): buckets that tile the
group, a slice of each per rank, and DeepSpeed's contiguous partitions for its files."""

import pytest
from mds_train.shard_layout import BUCKET_ALIGNMENT, shard_layout

# GPT-2 345M's weight-decay group: word and position embeddings, then per layer qkv, projection,
# and the MLP's two matrices
GPT2_345M = [50304 * 1024, 1024 * 1024] + [3 * 1024 * 1024, 1024 * 1024] + [4 * 1024 * 1024] * 2
GPT2_345M = GPT2_345M[:2] + GPT2_345M[2:] * 24


def test_the_word_embeddings_get_a_bucket_of_their_own():
    """Their gradient is ready last in backward: no other parameter waits in their bucket."""
    layout = shard_layout(GPT2_345M, rank=0, size=2, bucket_elements=25_000_000)
    assert layout.buckets[0] == (0, 50304 * 1024)
    assert all(numel <= 2 * 25_000_000 for _, numel in layout.buckets[1:])


@pytest.mark.parametrize("size", [2, 3, 4])
def test_buckets_tile_the_group_and_slices_tile_the_parameters(size):
    numels = [1000, 7, 513, 4096, 1, 333, 2048, 65]
    layouts = [shard_layout(numels, rank=r, size=size, bucket_elements=1500) for r in range(size)]
    layout = layouts[0]
    assert layout.padded_numel % (2 * size) == 0 and layout.padded_numel >= sum(numels)
    starts = [start for start, _ in layout.buckets]
    assert starts == [0] + [s + n for s, n in layout.buckets[:-1]]
    assert sum(n for _, n in layout.buckets) == layout.padded_numel
    assert all(n % (BUCKET_ALIGNMENT * size) == 0 for _, n in layout.buckets[:-1])
    assert all(n % size == 0 for _, n in layout.buckets)
    seen = [[0] * n for n in numels]  # how many ranks hold each value of each parameter
    for rank, mine in enumerate(layouts):
        assert sum(s.numel for s in mine.slices) == mine.partition_numel
        for piece, (start, numel) in zip(mine.slices, mine.buckets, strict=True):
            assert piece.start == start + rank * (numel // size)
        for f in mine.fragments:
            for k in range(f.start, f.start + f.numel):
                seen[f.index][k] += 1
    assert all(count == 1 for values in seen for count in values)


def test_deepspeed_partitions_are_contiguous_and_padded_at_the_end():
    """DeepSpeed's cut (`BF16_Optimizer`): rank r the r-th of DP equal partitions, its padding
    all past the parameters' end."""
    numels, size = [10, 3, 8], 4  # 21 values, padded to 24: 6 per rank
    pieces = []
    for rank in range(size):
        layout = shard_layout(numels, rank=rank, size=size, bucket_elements=1)
        assert layout.deepspeed_start == 6 * rank
        pieces.append(
            [(f.index, f.start, f.numel, f.partition_start) for f in layout.deepspeed_fragments]
        )
        assert layout.deepspeed_padding == (3 if rank == 3 else 0)
    assert pieces == [
        [(0, 0, 6, 0)],
        [(0, 6, 4, 0), (1, 0, 2, 4)],
        [(1, 2, 1, 0), (2, 0, 5, 1)],
        [(2, 5, 3, 0)],
    ]


@pytest.mark.parametrize("size", [2, 3])
def test_slices_overlapping_a_range_are_those_a_scan_finds(size):
    """The load's lookup (bisection over the slices) against a plain scan of every slice."""
    numels = [1000, 7, 513, 4096, 1, 333, 2048, 65]
    for rank in range(size):
        layout = shard_layout(numels, rank=rank, size=size, bucket_elements=700)
        for start in range(0, layout.padded_numel, 97):
            for numel in (1, 50, 700, 3000):
                scanned = [
                    s
                    for s in layout.slices
                    if s.start < start + numel and start < s.start + s.numel
                ]
                assert sorted(layout.slices_overlapping(start, numel), key=lambda s: s.start) == (
                    sorted(scanned, key=lambda s: s.start)
                )
