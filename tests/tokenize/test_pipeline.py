"""`mds-tokenize` end to end: the Megatron golden files, worker-count and compression invariance,
partition + merge == single run, bad lines, empty documents, several keys."""

import gzip
import json
import logging
import lzma
from pathlib import Path

import numpy as np
import pytest
import zstandard
from mds_indexed_data import IndexedDatasetReader
from mds_tokenize.cli import main
from mds_tokenize.config import TokenizeConfig
from mds_tokenize.pipeline import run


def cli(*args: str) -> int:
    with pytest.raises(SystemExit) as exit_info:
        main([str(arg) for arg in args])
    return exit_info.value.code


def dataset_bytes(prefix: str | Path) -> tuple[bytes, bytes]:
    return Path(f"{prefix}.bin").read_bytes(), Path(f"{prefix}.idx").read_bytes()


def write_jsonl(path: Path, records: list, *, raw_lines: list[bytes] = ()) -> Path:
    lines = [json.dumps(record, ensure_ascii=False).encode() for record in records] + list(
        raw_lines
    )
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@pytest.fixture(scope="module")
def both_corpora(shared_data, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "both.jsonl"
    path.write_bytes(
        (shared_data / "openwebtext-1000.jsonl").read_bytes()
        + (shared_data / "c4_demo.jsonl").read_bytes()
    )
    return path


def config(shared_data, input_path, prefix, **overrides) -> TokenizeConfig:
    settings = dict(
        input=Path(input_path),
        output_prefix=str(prefix),
        vocab_file=shared_data / "gpt2-vocab.json",
        merge_file=shared_data / "gpt2-merges.txt",
        append_eod=True,
    )
    settings.update(overrides)
    return TokenizeConfig(**settings)


@pytest.mark.parametrize("workers", [1, 2])
def test_reproduces_megatron_golden_files(shared_data, tmp_path, workers):
    golden = shared_data / "megatron-golden"
    # The command line of the bigscience test, in preprocess_data.py spellings.
    code = cli(
        "--input",
        shared_data / "openwebtext-1000.jsonl",
        "--output-prefix",
        tmp_path / "meg-gpt2-openwebtext",
        "--dataset-impl",
        "mmap",
        "--tokenizer-type",
        "GPT2BPETokenizer",
        "--merge-file",
        golden / "gpt2-tiny-merges.txt",
        "--vocab",
        golden / "gpt2-tiny-vocab.json",
        "--append-eod",
        "--workers",
        workers,
        "--log-interval",
        100,
    )
    assert code == 0
    assert dataset_bytes(tmp_path / "meg-gpt2-openwebtext_text_document") == dataset_bytes(
        golden / "meg-gpt2-openwebtext_text_document"
    )
    metadata = json.loads(
        (tmp_path / "meg-gpt2-openwebtext_text_document.tokenize.json").read_text()
    )
    assert metadata["num_documents"] == 1000 and metadata["num_tokens"] == 1361845
    assert metadata["tool"] == "mds-tokenize" and metadata["config"]["workers"] == workers
    inputs = ("openwebtext-1000.jsonl", "megatron-golden/gpt2-tiny-vocab.json")
    inputs += ("megatron-golden/gpt2-tiny-merges.txt",)
    assert metadata["inputs"] == [str((shared_data / name).resolve()) for name in inputs]
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "meg-gpt2-openwebtext_text_document.bin",
        "meg-gpt2-openwebtext_text_document.idx",
        "meg-gpt2-openwebtext_text_document.tokenize.json",
    ]


def test_worker_counts_and_block_sizes_give_identical_files(shared_data, tmp_path, both_corpora):
    outputs = []
    for workers, block_bytes in ((1, 1 << 20), (2, 1 << 16), (3, 200_000)):
        summary = run(
            config(
                shared_data,
                both_corpora,
                tmp_path / f"w{workers}",
                workers=workers,
                block_bytes=block_bytes,
            )
        )
        assert summary.num_docs == 1300 and summary.num_tokens == {"text": 1216481}
        outputs.append(dataset_bytes(tmp_path / f"w{workers}_text_document"))
    assert outputs[0] == outputs[1] == outputs[2]
    reader = IndexedDatasetReader(tmp_path / "w1_text_document")
    assert reader.dtype == np.uint16 and len(reader) == 1300


def test_compressed_inputs_give_identical_files(shared_data, tmp_path):
    plain = tmp_path / "c4.jsonl"
    plain.write_bytes((shared_data / "c4_demo.jsonl").read_bytes())
    data = plain.read_bytes()
    (tmp_path / "c4.jsonl.gz").write_bytes(gzip.compress(data))
    (tmp_path / "c4.jsonl.xz").write_bytes(lzma.compress(data))
    (tmp_path / "c4.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress(data[:300_000])
        + zstandard.ZstdCompressor().compress(data[300_000:])
    )
    expected = None
    for name in ("c4.jsonl", "c4.jsonl.gz", "c4.jsonl.xz", "c4.jsonl.zst"):
        prefix = tmp_path / name.replace(".", "-")
        run(config(shared_data, tmp_path / name, prefix, block_bytes=100_000))
        files = dataset_bytes(f"{prefix}_text_document")
        expected = expected or files
        assert files == expected, name


def test_corrupt_compressed_input(shared_data, tmp_path):
    path = tmp_path / "broken.jsonl.gz"
    path.write_bytes(gzip.compress((shared_data / "c4_demo.jsonl").read_bytes())[:5000])
    with pytest.raises(ValueError, match="broken.jsonl.gz: cannot decompress"):
        run(config(shared_data, path, tmp_path / "out"))
    assert list(tmp_path.iterdir()) == [path]


@pytest.mark.parametrize("num_partitions", [1, 3])
def test_partitions_then_merge_equal_single_run(
    shared_data, gpt2_args, tmp_path, both_corpora, num_partitions
):
    run(config(shared_data, both_corpora, tmp_path / "single"))
    for index in range(num_partitions):
        code = cli(
            "--input",
            both_corpora,
            "--output-prefix",
            tmp_path / "sharded",
            *gpt2_args,
            "--append-eod",
            "--partition",
            f"{index}/{num_partitions}",
        )
        assert code == 0
    assert sorted(path.name for path in tmp_path.glob("sharded*.idx")) == [
        f"sharded_text_document.part-{index:05d}-of-{num_partitions:05d}.idx"
        for index in range(num_partitions)
    ]
    assert cli("merge", "--output-prefix", tmp_path / "sharded") == 0
    assert dataset_bytes(tmp_path / "sharded_text_document") == dataset_bytes(
        tmp_path / "single_text_document"
    )
    assert not list(tmp_path.glob("*.part-*"))  # shards are removed after a merge


def test_more_partitions_than_lines(shared_data, tmp_path, gpt2_tokenizer):
    # 40 byte ranges over 7 lines: most shards are empty, the merge still equals one run.
    path = write_jsonl(
        tmp_path / "in.jsonl", [{"text": f"line {index} " * index} for index in range(7)]
    )
    run(config(shared_data, path, tmp_path / "single"), tokenizer=gpt2_tokenizer)
    num_docs = 0
    for index in range(40):
        summary = run(
            config(shared_data, path, tmp_path / "sharded", partition=(index, 40)),
            tokenizer=gpt2_tokenizer,
        )
        num_docs += summary.num_docs
    assert num_docs == 7
    assert cli("merge", "--output-prefix", tmp_path / "sharded", "--keep-parts") == 0
    assert dataset_bytes(tmp_path / "sharded_text_document") == dataset_bytes(
        tmp_path / "single_text_document"
    )
    assert len(list(tmp_path.glob("sharded_text_document.part-*-of-00040.idx"))) == 40


def test_merge_reports_missing_shards(shared_data, tmp_path, both_corpora, capsys):
    for index in (0, 2):
        run(config(shared_data, both_corpora, tmp_path / "p", partition=(index, 4)))
    assert cli("merge", "--output-prefix", tmp_path / "p", "--keep-parts") == 1
    error = capsys.readouterr().err
    assert "missing shards 1/4, 3/4; rerun `mds-tokenize --partition K/N` for them" in error
    assert len(error.strip().splitlines()) == 1
    assert not (tmp_path / "p_text_document.idx").exists()


def test_partition_flag_errors(shared_data, gpt2_args, tmp_path, both_corpora, capsys):
    for value, message in (("3/3", "K must be in 0..N-1 (0-based)"), ("1-of-3", "expected K/N")):
        code = cli(
            "--input",
            both_corpora,
            "--output-prefix",
            tmp_path / "x",
            *gpt2_args,
            "--partition",
            value,
        )
        assert code == 1
        assert message in capsys.readouterr().err
    gz = tmp_path / "in.jsonl.gz"
    gz.write_bytes(gzip.compress(b'{"text": "a"}\n'))
    with pytest.raises(ValueError, match="is compressed and cannot be split by byte ranges"):
        config(shared_data, gz, tmp_path / "x", partition=(0, 2))


BAD_LINES = [
    (b'{"text": "fine"', "not valid JSON (Expecting ',' delimiter at column 16)"),
    (b'["text"]', "expected a JSON object, got an array"),
    (b'{"body": "x"}', "missing key 'text' (keys: 'body'); choose keys with --json-keys"),
    (b'{"text": 3}', "value of 'text' is a number, expected a string"),
    (b'{"text": null}', "value of 'text' is null, expected a string"),
    (b'{"text": "caf\xe9"}', "invalid UTF-8 at byte 14 of the line"),
    (
        b'{"text": "lone \\ud800 surrogate"}',
        "value of 'text' holds a lone surrogate escape (\\ud800), which is not valid Unicode",
    ),
]


@pytest.mark.parametrize(("bad_line", "reason"), BAD_LINES)
def test_bad_line_stops_with_file_and_line(gpt2_args, tmp_path, capsys, bad_line, reason):
    path = write_jsonl(
        tmp_path / "in.jsonl",
        [{"text": "one"}, {"text": "two"}],
        raw_lines=[bad_line, b'{"text": "four"}'],
    )
    code = cli(
        "--input",
        path,
        "--output-prefix",
        tmp_path / "out",
        *gpt2_args,
        "--workers",
        2,
    )
    assert code == 1
    error = capsys.readouterr().err.strip()
    hint = "(fix the line, or pass --skip-bad-lines to skip such lines)"
    assert error == f"mds-tokenize: error: {path}:3: {reason} {hint}"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["in.jsonl"]  # nothing half-written


def test_skip_bad_lines_counts_and_keeps_good_lines(shared_data, tmp_path, caplog):
    records = [{"text": f"document {index}"} for index in range(4)]
    path = write_jsonl(
        tmp_path / "in.jsonl",
        records,
        raw_lines=[line for line, _ in BAD_LINES] + [b'{"text": "last"}'],
    )
    with caplog.at_level(logging.INFO):
        summary = run(
            config(shared_data, path, tmp_path / "out", skip_bad_lines=True, append_eod=False)
        )
    assert summary.num_bad_lines == len(BAD_LINES) and summary.num_docs == 5
    assert f"skipped {path}:5: not valid JSON" in caplog.text
    reader = IndexedDatasetReader(tmp_path / "out_text_document")
    assert len(reader) == 5
    assert reader.get(4).tolist() == [12957]  # "last"


def test_empty_documents_blank_lines_bom_and_no_final_newline(
    shared_data, tmp_path, gpt2_tokenizer
):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"text": "Hello"}\n\n{"text": ""}\n   \n{"text": "world!"}')
    summary = run(config(shared_data, path, tmp_path / "out"))
    assert summary.num_docs == 3 and summary.num_empty == {"text": 1}
    reader = IndexedDatasetReader(tmp_path / "out_text_document")
    # The empty document gets no item and no EOD, as in Megatron.
    assert [reader.get(i).tolist() for i in range(len(reader))] == [
        [15496, 50256],
        [6894, 0, 50256],
    ]
    assert reader.doc_idx.tolist() == [0, 1, 2]


def test_several_json_keys_preprocess_data_style(gpt2_args, tmp_path, gpt2_tokenizer):
    records = [
        {"title": "T1", "text": "Body one"},
        {"title": "", "text": "Body two"},
        {"title": "T3", "text": "x"},
    ]
    path = write_jsonl(tmp_path / "in.jsonl", records)
    assert (
        cli(
            "--input",
            path,
            "--output-prefix",
            tmp_path / "out",
            *gpt2_args,
            "--json-keys",
            "text",
            "title",
        )
        == 0
    )
    text = IndexedDatasetReader(tmp_path / "out_text_document")
    title = IndexedDatasetReader(tmp_path / "out_title_document")
    assert [gpt2_tokenizer.decode(text.get(i)) for i in range(len(text))] == [
        "Body one",
        "Body two",
        "x",
    ]
    assert [gpt2_tokenizer.decode(title.get(i)) for i in range(len(title))] == ["T1", "T3"]


def test_append_eod_needs_an_eod_token(shared_data, tmp_path, capsys):
    vocab = json.loads((shared_data / "gpt2-vocab.json").read_text())
    del vocab["<|endoftext|>"]
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    path = write_jsonl(tmp_path / "in.jsonl", [{"text": "a"}])
    code = cli(
        "--input",
        path,
        "--output-prefix",
        tmp_path / "out",
        "--vocab-file",
        tmp_path / "vocab.json",
        "--merge-file",
        shared_data / "gpt2-merges.txt",
        "--append-eod",
    )
    assert code == 1
    assert "--append-eod: " in capsys.readouterr().err


def test_periodic_progress_lines(shared_data, tmp_path, both_corpora, caplog):
    with caplog.at_level(logging.INFO):
        run(
            config(
                shared_data, both_corpora, tmp_path / "out", log_interval=500, block_bytes=1 << 18
            )
        )
    progress = [
        record.getMessage()
        for record in caplog.records
        if record.getMessage().startswith("processed")
    ]
    assert len(progress) >= 2
    assert all("docs/s" in line and "MB/s" in line and "ETA" in line for line in progress)
    summary = [
        record.getMessage() for record in caplog.records if record.getMessage().startswith("done")
    ]
    assert summary == [summary[0]] and "1,300 docs, 1,216,481 tokens, 5,467,425 bytes" in summary[0]


def test_pool_keeps_a_bounded_number_of_blocks_in_flight():
    from mds_tokenize.pipeline import _ordered_pool_results

    class FakeResult:
        def __init__(self, value):
            self.value = value

        def get(self):
            return self.value

    class FakePool:
        def apply_async(self, function, args):
            return FakeResult(args[0] * 10)

    consumed = []

    def blocks():
        for index in range(100):
            consumed.append(index)
            yield index

    results = []
    for result in _ordered_pool_results(FakePool(), blocks(), max_in_flight=5):
        # Never more than 5 blocks read ahead of the results handed back.
        assert len(consumed) - len(results) <= 5
        results.append(result)
    assert results == [index * 10 for index in range(100)]
