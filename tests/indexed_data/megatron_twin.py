"""A slow pure-Python twin of bigscience's GPT index construction (README: "Upstream behaviour").

Deliberately independent of the implementation under test: its own MT19937 (seeded as numpy's legacy
`RandomState(int)`), its own Fisher-Yates with masked rejection, plain loops and lists everywhere.
Only the final comparison converts to numpy.
"""

import math

# ---- MT19937 and numpy's legacy RandomState.shuffle ----


class MersenneTwister:
    """MT19937 with `init_genrand(seed)`, which is what `RandomState(int_seed)` uses."""

    def __init__(self, seed: int):
        self.state = [0] * 624
        self.state[0] = seed & 0xFFFFFFFF
        for i in range(1, 624):
            previous = self.state[i - 1]
            self.state[i] = (1812433253 * (previous ^ (previous >> 30)) + i) & 0xFFFFFFFF
        self.position = 624

    def _twist(self) -> None:
        state = self.state
        for i in range(624):
            y = (state[i] & 0x80000000) | (state[(i + 1) % 624] & 0x7FFFFFFF)
            value = state[(i + 397) % 624] ^ (y >> 1)
            if y & 1:
                value ^= 0x9908B0DF
            state[i] = value
        self.position = 0

    def next_uint32(self) -> int:
        if self.position >= 624:
            self._twist()
        y = self.state[self.position]
        self.position += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        y ^= y >> 18
        return y

    def bounded(self, high: int) -> int:
        """Uniform in [0, high] by masked rejection on 32-bit draws (high < 2**32)."""
        if high == 0:
            return 0
        mask = high
        for shift in (1, 2, 4, 8, 16):
            mask |= mask >> shift
        while True:
            value = self.next_uint32() & mask
            if value <= high:
                return value

    def shuffle(self, values: list) -> None:
        for i in range(len(values) - 1, 0, -1):
            j = self.bounded(i)
            values[i], values[j] = values[j], values[i]


# ---- one dataset split ---------------------------------------------------------------------------


def split_ranges(text: str, num_documents: int) -> list[tuple[int, int]]:
    if "," in text:
        weights = [float(part) for part in text.split(",")]
    elif "/" in text:
        weights = [float(part) for part in text.split("/")]
    else:
        weights = [float(text)]
    while len(weights) < 3:
        weights.append(0.0)
    weights = weights[:3]
    total = sum(weights)
    weights = [weight / total for weight in weights]
    bounds = [0]
    for weight in weights:
        bounds.append(bounds[-1] + int(round(weight * float(num_documents))))
    diff = bounds[3] - num_documents
    for k in (1, 2, 3):
        bounds[k] -= diff
    return [(bounds[k], bounds[k + 1]) for k in range(3)]


def index_mappings(
    sizes: list[int],
    start: int,
    end: int,
    num_samples: int,
    seq_length: int,
    seed: int,
    cutoff: float = 0.95,
):
    """(doc_idx, sample_idx rows, shuffle_idx, num_epochs, separate) as Python lists."""
    documents = list(range(start, end))
    tokens_per_epoch = 0
    for d in documents:
        tokens_per_epoch += sizes[d]
    num_epochs = 0
    total = 0
    while True:
        num_epochs += 1
        total += tokens_per_epoch
        if (total - 1) // seq_length >= num_samples:
            break
    if num_epochs == 1:
        separate = False
    else:
        previous = ((num_epochs - 1) * tokens_per_epoch - 1) // seq_length
        last = num_samples - previous
        per_epoch = (tokens_per_epoch - 1) // seq_length
        separate = last < int(cutoff * per_epoch)

    rng = MersenneTwister(seed)
    if separate:
        first = documents * (num_epochs - 1)
        rng.shuffle(first)
        last_epoch = list(documents)
        rng.shuffle(last_epoch)
        doc_idx = first + last_epoch
    else:
        doc_idx = documents * num_epochs
        rng.shuffle(doc_idx)

    total_samples = (num_epochs * tokens_per_epoch - 1) // seq_length
    rows = [(0, 0)]
    position, offset = 0, 0
    while len(rows) <= total_samples:
        remaining = seq_length + 1
        while True:
            available = sizes[doc_idx[position]] - offset
            if available >= remaining:
                offset += remaining - 1
                break
            remaining -= available
            position += 1
            offset = 0
        rows.append((position, offset))

    boundary = (
        ((num_epochs - 1) * tokens_per_epoch - 1) // seq_length if separate else total_samples
    )
    shuffle_first = list(range(boundary))
    rng.shuffle(shuffle_first)
    shuffle_last = list(range(boundary, total_samples))
    if shuffle_last:
        rng.shuffle(shuffle_last)
    return doc_idx, rows, shuffle_first + shuffle_last, num_epochs, separate


def sample_tokens(tokens_of, doc_idx, rows, shuffle_idx, i) -> list[int]:
    """Sample i, gathering L + 1 tokens one by one from (row, offset) to the next row inclusive."""
    j = shuffle_idx[i]
    (position, offset), (last_position, last_offset) = rows[j], rows[j + 1]
    out = []
    while True:
        document = tokens_of(doc_idx[position])
        stop = last_offset + 1 if position == last_position else len(document)
        out.extend(int(t) for t in document[offset:stop])
        if position == last_position:
            return out
        position += 1
        offset = 0


# ---- blending ----


def numpy_pairwise_sum(values: list[float]) -> float:
    """np.sum of a contiguous float64 array: 8 accumulators below 128 items, halves above."""
    n = len(values)
    if n < 8:
        total = 0.0
        for value in values:
            total += value
        return total
    if n <= 128:
        accumulators = list(values[:8])
        i = 8
        while i < n - (n % 8):
            for k in range(8):
                accumulators[k] += values[i + k]
            i += 8
        total = ((accumulators[0] + accumulators[1]) + (accumulators[2] + accumulators[3])) + (
            (accumulators[4] + accumulators[5]) + (accumulators[6] + accumulators[7])
        )
        for value in values[i:]:
            total += value
        return total
    half = n // 2
    half -= half % 8
    return numpy_pairwise_sum(values[:half]) + numpy_pairwise_sum(values[half:])


def blend_weights(raw_weights: list[float]) -> list[float]:
    total = 0.0
    for weight in raw_weights:
        total += weight
    return [weight / total for weight in raw_weights]


def component_counts(weights: list[float], num_samples: list[int]) -> list[list[int]]:
    return [[int(math.ceil(n * w * 1.005)) for n in num_samples] for w in weights]


def blending_indices(weights: list[float], size: int) -> tuple[list[int], list[int]]:
    total = numpy_pairwise_sum(weights)  # BlendableDataset normalises again with np.sum
    weights = [weight / total for weight in weights]
    counts = [0] * len(weights)
    dataset_index, sample_index = [], []
    for s in range(size):
        x = max(float(s), 1.0)
        best, best_error = 0, weights[0] * x - counts[0]
        for d in range(1, len(weights)):
            error = weights[d] * x - counts[d]
            if error > best_error:
                best, best_error = d, error
        dataset_index.append(best)
        sample_index.append(counts[best])
        counts[best] += 1
    return dataset_index, sample_index
