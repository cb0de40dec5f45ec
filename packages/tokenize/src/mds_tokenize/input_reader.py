"""Streams a jsonl file (plain, .gz, .xz or .zst by extension) as blocks of whole lines.

Memory stays bounded whatever the file size (one block plus one partial line). `--partition K/N`
takes the lines that start in the K-th of N equal byte ranges, so N shards tile the file exactly.
"""

import gzip
import lzma
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

UTF8_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class Block:
    """Whole lines of the input; `first_line` is 1-based within the file (or within the shard)."""

    data: bytes
    first_line: int
    offset: int  # byte offset of data[0] in the (decompressed) input


class InputError(ValueError):
    """Unreadable input: a corrupt or truncated compressed file, or a .zst without zstandard."""


def import_zstandard(path: Path):
    """zstandard, imported only for a .zst input: the encoder and `import mds_tokenize` work on
    images that lack it (the GPU machine's)."""
    try:
        import zstandard
    except ImportError:
        raise InputError(
            f"{path}: a .zst input needs the zstandard package, which is not installed: "
            "pip install zstandard (or decompress the file: zstd -d)"
        ) from None
    return zstandard


class ZstdFramesReader:
    """Decompresses concatenated zstd frames (as `zstd -d`) and refuses a stream that ends inside a
    frame. zstandard's own stream_reader returns the blocks decoded so far as if the file were
    complete, so a file cut at a block boundary would lose its tail silently."""

    CHUNK_BYTES = 1 << 16  # compressed bytes fed at a time: bounds the decompressed backlog

    def __init__(self, raw, zstandard):
        self._raw = raw
        self._zstandard = zstandard
        self._decompressor = zstandard.ZstdDecompressor()
        self._frame = None  # the decompressobj of the frame being read; None between frames
        self._pending = bytearray()  # decompressed, not yet returned (front deletes are cheap)

    def read(self, size: int) -> bytes:
        while len(self._pending) < size:
            compressed = self._raw.read(self.CHUNK_BYTES)
            if not compressed:
                if self._frame is not None:
                    raise self._zstandard.ZstdError("the file ends inside a zstd frame")
                break
            self._decompress(compressed)
        chunk = bytes(self._pending[:size])
        del self._pending[:size]
        return chunk

    def _decompress(self, compressed: bytes) -> None:
        while compressed:
            if self._frame is None:
                self._frame = self._decompressor.decompressobj()
            self._pending += self._frame.decompress(compressed)
            if not self._frame.eof:
                return  # every byte went into the current, still open, frame
            compressed = self._frame.unused_data  # the start of the next frame, if any
            self._frame = None

    def close(self) -> None:
        self._pending = bytearray()


def _line_start_at_or_after(handle, offset: int, size: int) -> int:
    """The first offset >= `offset` where a line starts (size if none)."""
    if offset <= 0:
        return 0
    if offset >= size:
        return size
    handle.seek(offset - 1)
    position = offset - 1
    while True:
        chunk = handle.read(1 << 16)
        if not chunk:
            return size
        newline = chunk.find(b"\n")
        if newline >= 0:
            return position + newline + 1
        position += len(chunk)


def partition_range(path: Path, index: int, count: int) -> tuple[int, int]:
    """Byte range [start, end) of shard `index` of `count` in an uncompressed file."""
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        start = _line_start_at_or_after(handle, size * index // count, size)
        end = _line_start_at_or_after(handle, size * (index + 1) // count, size)
    return start, end


class InputReader:
    """Iterate to get Blocks; `position` and `total` give progress in on-disk bytes."""

    def __init__(
        self, path: str | Path, *, block_bytes: int, partition: tuple[int, int] | None = None
    ):
        self.path = Path(path)
        self.block_bytes = block_bytes
        suffix = self.path.suffix
        # What the decompressor raises on a corrupt or truncated file.
        self._decompress_errors: tuple[type[Exception], ...] = (OSError, EOFError, lzma.LZMAError)
        if suffix == ".zst":
            zstandard = import_zstandard(self.path)  # before open(): a refusal leaves nothing open
            self._decompress_errors += (zstandard.ZstdError,)
        self._raw = open(self.path, "rb")  # noqa: SIM115 - closed by close()
        self.start, self.end = 0, os.path.getsize(self.path)
        if partition is not None:
            self.start, self.end = partition_range(self.path, *partition)
            self._raw.seek(self.start)
        if suffix == ".gz":
            self._stream = gzip.GzipFile(fileobj=self._raw, mode="rb")
        elif suffix == ".xz":
            self._stream = lzma.LZMAFile(self._raw, mode="rb")
        elif suffix == ".zst":
            self._stream = ZstdFramesReader(self._raw, zstandard)
        else:
            self._stream = self._raw
        self.total = self.end - self.start
        self.num_bytes_read = 0

    @property
    def position(self) -> int:
        """On-disk bytes consumed so far (compressed bytes for a compressed file)."""
        if self._stream is self._raw:
            return self.num_bytes_read
        return min(self._raw.tell(), self.end)

    def _read(self, size: int) -> bytes:
        if self._stream is self._raw:
            size = min(size, self.end - self.start - self.num_bytes_read)
            if size <= 0:
                return b""
        try:
            chunk = self._stream.read(size)
        except self._decompress_errors as error:
            raise InputError(
                f"{self.path}: cannot decompress ({error}); the file is corrupt or truncated"
            ) from None
        self.num_bytes_read += len(chunk)
        return chunk

    def __iter__(self) -> Iterator[Block]:
        carry = b""
        offset = self.start
        first_line = 1
        at_start = self.start == 0
        while True:
            chunk = self._read(self.block_bytes)
            if at_start:
                at_start = False
                if chunk.startswith(UTF8_BOM):
                    # Editors on Windows add it; json.loads would reject the first line for it.
                    chunk = chunk[len(UTF8_BOM) :]
                    offset += len(UTF8_BOM)
            if not chunk:
                if carry:
                    yield Block(carry, first_line, offset)
                return
            data = carry + chunk if carry else chunk
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                carry = data  # one line longer than a block: keep reading until it ends
                continue
            block, carry = data[:cut], data[cut:]
            yield Block(block, first_line, offset)
            first_line += block.count(b"\n")
            offset += len(block)

    def close(self) -> None:
        if self._stream is not self._raw:
            self._stream.close()
        self._raw.close()

    def __enter__(self) -> "InputReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
