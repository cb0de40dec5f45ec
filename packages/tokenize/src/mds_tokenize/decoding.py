"""`mds-tokenize decode`: token ids back to text, one output line per input line of ids, so that
`mds-index show PREFIX --doc 3 | mds-tokenize decode --vocab-file v.json --merge-file m.txt` prints
the document (Megatron's `tokenizer.detokenize`: token bytes joined, invalid UTF-8 replaced)."""

from collections.abc import Iterable, Iterator

from mds_tokenize.interface import Tokenizer


def parse_ids(text: str, *, where: str) -> list[int]:
    """Whitespace- or comma-separated ids; ValueError naming `where` (e.g. `stdin:3`)."""
    ids = []
    for word in text.replace(",", " ").split():
        try:
            ids.append(int(word))
        except ValueError:
            raise ValueError(
                f"{where}: {word!r} is not a token id; decode reads integers separated by spaces"
            ) from None
    return ids


def decode_lines(tokenizer: Tokenizer, lines: Iterable[str], *, source: str) -> Iterator[str]:
    """The text of each line of ids in `lines` (read from `source`, for messages)."""
    for number, line in enumerate(lines, start=1):
        where = f"{source}:{number}"
        ids = parse_ids(line, where=where)
        try:
            yield tokenizer.decode(ids)
        except ValueError as error:
            raise ValueError(f"{where}: {error}; was it tokenized with this vocabulary?") from None
