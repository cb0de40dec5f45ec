"""mds_common.files.FolderLock: one run at a time in a folder. A second holder is refused with a
message that names the first (pid, host, start, command); a lock whose holder was killed is free
again; release leaves the folder as it found it."""

import errno
import fcntl
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest
from mds_common.files import FolderInUse, FolderLock

NAME = ".tool.lock"

HOLDER = textwrap.dedent(
    """
    import sys, time
    from mds_common.files import FolderLock

    lock = FolderLock(sys.argv[1], name=sys.argv[2], command="tool --save somewhere --seed 7")
    assert lock.acquire()
    print("locked", flush=True)
    time.sleep(600)
    """
)


def test_a_second_lock_is_refused_naming_the_holder(tmp_path):
    first = FolderLock(tmp_path, name=NAME, command="tool --save x --seed 1")
    assert first.acquire() and first.locked
    with pytest.raises(FolderInUse) as refused:
        FolderLock(tmp_path, name=NAME, command="tool --save x --seed 2").acquire()
    holder = refused.value.holder
    assert holder.startswith(f"pid {os.getpid()} on host {socket.gethostname()}, started 20")
    assert holder.endswith(": tool --save x --seed 1")
    assert str(refused.value) == (
        f"{tmp_path}: in use by another run ({holder}); wait for it to end or write elsewhere"
    )
    first.release()
    with FolderLock(tmp_path, name=NAME, command="tool --seed 2") as second:
        assert second.locked
    assert not (tmp_path / NAME).exists()


def test_a_lock_held_by_a_killed_process_is_free_again(tmp_path):
    """flock: the kernel drops the lock when its process dies, kill -9 included; the file it
    leaves behind is taken over."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path), NAME], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout.readline() == "locked\n"
        with pytest.raises(FolderInUse) as refused:
            FolderLock(tmp_path, name=NAME).acquire()
        assert refused.value.holder.startswith(f"pid {process.pid} on host ")
        assert refused.value.holder.endswith(": tool --save somewhere --seed 7")
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert (tmp_path / NAME).exists()  # left by the killed holder
    lock = FolderLock(tmp_path, name=NAME, command="next")
    assert lock.acquire()
    assert f'"pid": {os.getpid()}' in (tmp_path / NAME).read_text()
    lock.release()


def test_release_removes_what_acquire_made(tmp_path):
    folder = tmp_path / "new" / "ckpt"
    with FolderLock(folder, name=NAME):
        assert (folder / NAME).is_file()
    assert not (tmp_path / "new").exists()  # made for the lock alone: gone with it
    with FolderLock(folder, name=NAME):
        (folder / "latest").write_text("global_step1")  # the run's output
    assert sorted(p.name for p in folder.iterdir()) == ["latest"]
    existing = tmp_path / "existing"
    existing.mkdir()
    with FolderLock(existing, name=NAME):
        pass
    assert existing.is_dir() and list(existing.iterdir()) == []


def test_a_lock_on_a_file_its_holder_removed_is_taken_again(tmp_path, monkeypatch):
    """A run that opened the lock file just before its holder released (unlinked) it locks an
    unlinked file: it must notice that the path names another file and lock that one, else two
    runs would hold 'the' lock at once."""
    first = FolderLock(tmp_path, name=NAME, command="first")
    assert first.acquire()
    flocks = []
    real_flock = fcntl.flock

    def flock_after_release(descriptor, operation):
        flocks.append(descriptor)
        if len(flocks) == 1:  # the first holder releases between our open and our flock
            first.release()
            assert first.acquire()  # and a third run takes the path's new file
        return real_flock(descriptor, operation)

    stale = FolderLock(tmp_path, name=NAME, command="old opener")
    monkeypatch.setattr(fcntl, "flock", flock_after_release)
    with pytest.raises(FolderInUse) as refused:
        stale.acquire()
    assert refused.value.holder.endswith(": first")
    # Ours on the removed file (granted, then let go), the third run's, ours on the new file.
    assert len(flocks) == 3
    monkeypatch.undo()
    first.release()


def test_a_filesystem_without_locks_warns_once_and_goes_on(tmp_path, monkeypatch, caplog):
    def no_locks(descriptor, operation):  # noqa: ARG001 - Lustre without `-o flock`
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    lock = FolderLock(tmp_path, name=NAME)
    with caplog.at_level(logging.WARNING):
        assert lock.acquire() is False
    assert caplog.messages == [
        f"{tmp_path}: the filesystem does not support file locks (Function not implemented); "
        "another run writing into this folder at the same time would not be stopped"
    ]
    assert not lock.locked and not (tmp_path / NAME).exists()
    lock.release()  # nothing to release: no error
