"""`--split` strings to document ranges, as Megatron's `get_train_valid_test_split_`.

`"949,50,1"`, `"969, 30, 1"` and `"98/2/0"` all parse: split on `,` if present, else on `/`, pad to
three weights with 0, normalise, round each share with Python's half-to-even `round`, then shift the
rounding error onto the end indices so the last range ends exactly at the number of documents.
"""

import math

SPLIT_NAMES = ("train", "valid", "test")


def parse_split(text: str) -> tuple[float, float, float]:
    """The three split weights normalised to sum 1; ValueError naming --split on anything else."""
    separator = "," if "," in text else "/" if "/" in text else None
    parts = text.split(separator) if separator else [text]
    weights = []
    for part in parts:
        try:
            weight = float(part)
        except ValueError:
            raise ValueError(
                f"--split {text!r}: {part.strip()!r} is not a number; use three weights such as "
                "'949,50,1' or '98/2/0'"
            ) from None
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(
                f"--split {text!r}: weights must be finite and >= 0, got {part.strip()!r}"
            )
        weights.append(weight)
    if len(weights) > 3:
        # Megatron silently ignores extra entries; a fourth weight is almost surely a typo.
        raise ValueError(f"--split {text!r}: at most three weights (train, valid, test)")
    weights += [0.0] * (3 - len(weights))
    total = sum(weights)
    if total <= 0:
        raise ValueError(
            f"--split {text!r}: the weights sum to 0; give at least one positive weight"
        )
    return weights[0] / total, weights[1] / total, weights[2] / total


def split_document_ranges(text: str, num_documents: int) -> tuple[tuple[int, int], ...]:
    """[(start, end)] for train, valid and test over `num_documents` items."""
    fractions = parse_split(text)
    bounds = [0]
    for fraction in fractions:
        bounds.append(bounds[-1] + int(round(fraction * float(num_documents))))
    excess = bounds[-1] - num_documents
    bounds = [bounds[0]] + [bound - excess for bound in bounds[1:]]
    # Upstream can produce a negative start when rounding overshoots next to a 0 weight (e.g.
    # "0,1,1" over 3 documents) and then crashes; clamping only changes those crashing cases.
    for k in range(1, 4):
        bounds[k] = min(max(bounds[k], bounds[k - 1]), num_documents)
    return tuple((bounds[k], bounds[k + 1]) for k in range(3))
