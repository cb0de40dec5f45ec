"""mds_common.files: outputs appear complete or not at all, and the temporaries of killed runs are
removed by the next writer, never those of a live process or of another host."""

import errno
import os
import signal
import subprocess
import sys

import pytest
from mds_common import files
from mds_common.files import (
    AtomicFile,
    atomic_directory,
    atomic_write,
    remove_stale_temporaries,
    temporary_path,
    write_files_atomically,
    write_text_atomically,
)


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_write_replaces_only_when_complete(tmp_path):
    path = tmp_path / "out.txt"
    write_text_atomically(path, "old\n")
    with pytest.raises(RuntimeError), atomic_write(path, "w") as file:
        file.write("half")
        raise RuntimeError("killed halfway")
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]
    with atomic_write(path, "w") as file:
        file.write("new\n")
        assert temporary_path(path).exists() and path.read_text() == "old\n"
    assert path.read_text() == "new\n" and not temporary_path(path).exists()


def test_temporary_name_holds_pid_and_host(tmp_path):
    name = temporary_path(tmp_path / "a.bin").name
    assert name.startswith(f"a.bin.tmp-{os.getpid()}-") and name.endswith(files._HOST)


def test_commit_order_is_the_callers(tmp_path):
    data, index = AtomicFile(tmp_path / "d.bin"), AtomicFile(tmp_path / "d.idx")
    data.file.write(b"tokens")
    index.file.write(b"index")
    data.commit()
    assert (tmp_path / "d.bin").exists() and not (tmp_path / "d.idx").exists()
    index.commit()
    assert (tmp_path / "d.idx").read_bytes() == b"index"


def test_stale_temporaries_of_dead_processes_are_removed(tmp_path):
    target = tmp_path / "corpus.bin"
    dead, host = dead_pid(), files._HOST
    stale = [
        tmp_path / f"corpus.bin.tmp-{dead}",  # older outputs: no host
        tmp_path / f"corpus.bin.tmp-{dead}-0123abcd",  # older caches: a random tag
        tmp_path / f"corpus.bin.tmp-{dead}-{host}",
    ]
    kept = [
        tmp_path / f"corpus.bin.tmp-{os.getpid()}-{host}-x",  # not a name we write
        tmp_path / f"corpus.bin.tmp-{os.getppid()}-{host}",  # a live process
        tmp_path
        / f"corpus.bin.tmp-{dead}-other-node",  # another host's: its PID means nothing here
        tmp_path / f"other.bin.tmp-{dead}-{host}",  # another output's
        tmp_path / "corpus.bin.tmp-notapid",
    ]
    for path in stale + kept:
        path.write_bytes(b"x" * 10)
    (tmp_path / f"corpus.bin.tmp-{dead}-{host}-old").mkdir()  # a folder being replaced
    (tmp_path / f"corpus.bin.tmp-{dead}-{host}-old" / "f").write_bytes(b"y")
    stale.append(tmp_path / f"corpus.bin.tmp-{dead}-{host}-old")
    with atomic_write(target) as file:
        file.write(b"new")
    remaining = sorted(p.name for p in tmp_path.iterdir())
    assert remaining == sorted([target.name] + [p.name for p in kept])
    assert remove_stale_temporaries(target) == []


def test_a_killed_writer_leaves_a_temporary_the_next_run_removes(tmp_path):
    script = (
        "import sys, time; from mds_common.files import AtomicFile;"
        "f = AtomicFile(sys.argv[1]); f.file.write(b'x' * 1000); f.file.flush();"
        "print('ready', flush=True); time.sleep(60)"
    )
    target = tmp_path / "data.bin"
    process = subprocess.Popen(
        [sys.executable, "-c", script, str(target)], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout.readline() == "ready\n"
    (temporary,) = tmp_path.iterdir()
    assert remove_stale_temporaries(target) == []  # alive: kept
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert remove_stale_temporaries(target) == [temporary]
    assert list(tmp_path.iterdir()) == []


def test_several_files_appear_together_or_not_at_all(tmp_path):
    (tmp_path / "vocab.json").write_text("old")
    with pytest.raises(OSError):
        write_files_atomically(
            {tmp_path / "vocab.json": "new", tmp_path / "vocab.json" / "merges.txt": "m"}
        )
    assert (tmp_path / "vocab.json").read_text() == "old"
    write_files_atomically({tmp_path / "vocab.json": "new", tmp_path / "merges.bin": b"m"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merges.bin", "vocab.json"]


def test_atomic_directory(tmp_path):
    out = tmp_path / "checkpoint"
    with atomic_directory(out) as folder:
        (folder / "a").write_text("1")
        assert not out.exists()
    assert (out / "a").read_text() == "1"
    with pytest.raises(RuntimeError), atomic_directory(out) as folder:
        (folder / "b").write_text("2")
        raise RuntimeError
    assert sorted(p.name for p in out.iterdir()) == ["a"]
    with atomic_directory(out) as folder:
        (folder / "c").write_text("3")
    assert sorted(p.name for p in out.iterdir()) == ["c"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


def test_a_failed_write_is_one_line_naming_the_folder(tmp_path, monkeypatch):
    """What reporting_write_failures makes of each kind of failure inside its block."""
    out = tmp_path / "out"

    def failure(error, *, free=None):
        if free is not None:
            monkeypatch.setattr(files, "free_bytes", lambda path: free)  # noqa: ARG005
        with pytest.raises(BaseException) as raised:  # noqa: PT011 - what comes out is the test
            with files.reporting_write_failures(
                out,
                doing="writing",
                advice="choose another folder",
                writer_error=lambda e: isinstance(e, RuntimeError),
            ):
                raise error
        return raised.value

    # A real full disk: /dev/full fails every write with ENOSPC (write() names no file).
    with pytest.raises(files.WriteFailed) as raised:
        with files.reporting_write_failures(out, doing="writing", advice="choose another folder"):
            with open("/dev/full", "wb") as full:
                full.write(b"x" * 65536)
    assert str(raised.value).startswith(f"writing {out}: No space left on device (")
    assert str(raised.value).endswith(
        " free there); free some space there or choose another folder"
    )
    # A writer's own error quoting the OS error (safetensors), whatever the free space.
    quoted = failure(RuntimeError("I/O error: No space left on device (os error 28)"), free=10**9)
    assert str(quoted) == (
        f"writing {out}: No space left on device (953 MiB free there); free some space there or "
        "choose another folder"
    )
    # One saying nothing (torch.save: "unexpected pos"): a full filesystem is the reason ...
    assert str(failure(RuntimeError("unexpected pos 9 vs 7"), free=4096)) == (
        f"writing {out}: No space left on device (4,096 bytes free there); free some space there "
        "or choose another folder"
    )
    # ... or, with space left, its own words.
    assert str(failure(RuntimeError("unexpected pos 9 vs 7"), free=2**31)) == (
        f"writing {out}: the write failed (unexpected pos 9 vs 7) (2.0 GiB free there); choose "
        "another folder"
    )
    # Other OS errors: the reason and the file, no word of space.
    denied = PermissionError(errno.EACCES, "Permission denied", str(out / "a.pt"))
    assert str(failure(denied)) == (
        f"writing {out}: Permission denied (writing {out / 'a.pt'}); choose another folder"
    )
    # Anything else is not a failed write and comes out as it went in.
    bug = KeyError("weight")
    assert failure(bug) is bug
    # A block that reads too reports only a full disk: a missing input is the reader's to name.
    missing = FileNotFoundError(errno.ENOENT, "No such file or directory", "source.pt")
    with pytest.raises(FileNotFoundError) as raised:
        with files.reporting_write_failures(out, doing="w", advice="a", reads_too=True):
            raise missing
    assert raised.value is missing
    with pytest.raises(files.WriteFailed, match="No space left on device"):
        with files.reporting_write_failures(out, doing="w", advice="a", reads_too=True):
            raise OSError(errno.ENOSPC, "No space left on device")
