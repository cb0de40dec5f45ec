"""Atomic outputs: write under `NAME.tmp-PID-HOST`, fsync, rename into place; removal of the
temporaries that killed runs (`kill -9`, OOM, a lost node) leave behind; and a lock that keeps a
second run out of a folder that one run is writing (`FolderLock`, flock(2) on a file in it).

A reader never sees a half-written file: the final name appears only by `os.replace`, which is
atomic on POSIX filesystems. The host is part of the temporary's name because on a shared
filesystem a PID only identifies a process together with its host.
"""

import errno
import fcntl
import json
import logging
import os
import re
import shutil
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import IO

logger = logging.getLogger(__name__)

_HOST = socket.gethostname().split(".")[0] or "localhost"
# NAME.tmp-PID-HOST, or NAME.tmp-PID-HOST-old (a folder being replaced); the older outputs' names
# NAME.tmp-PID and NAME.tmp-PID-RANDOM8 (without a host) are recognised too.
_TEMPORARY = re.compile(r"\.tmp-(?P<pid>\d+)(?:-(?P<host>.+?))?(?:-old)?$")
_LEGACY_TAG = re.compile(r"[0-9a-f]{8}")
# After a failed write, a filesystem with less than this left is taken to be full (the failed
# writer's partial file still holds its space when this is measured).
FULL_BELOW_BYTES = 1 << 20
# An OS error code quoted in a writer's own message: Rust's `Os { code: 28, ...}`, `os error 28`.
_QUOTED_ERRNO = re.compile(r"(?:\bcode: |os error )(\d+)")


def temporary_path(path: str | os.PathLike) -> Path:
    """The name this process writes `path` under before renaming it into place."""
    path = Path(path)
    return path.with_name(f"{path.name}.tmp-{os.getpid()}-{_HOST}")


def _process_is_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    except OverflowError:
        return False
    return True


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Removes the temporaries of `path` (files or folders `NAME.tmp-PID[-HOST]` beside it) whose
    writer is gone: a PID that is not alive on this host. Temporaries of live processes and of
    other hosts are kept. Returns what was removed."""
    path = Path(path)
    removed = []
    try:
        candidates = list(path.parent.glob(f"{_glob_escape(path.name)}.tmp-*"))
    except OSError:
        return removed
    for candidate in candidates:
        match = _TEMPORARY.fullmatch(candidate.name[len(path.name) :])
        if match is None:
            continue
        host = match.group("host")
        if host is not None and host != _HOST and not _LEGACY_TAG.fullmatch(host):
            continue
        if _process_is_alive(int(match.group("pid"))):
            continue
        try:
            size = _remove(candidate)
        except OSError as error:
            logger.warning("could not remove stale temporary %s: %s", candidate, error)
            continue
        logger.info("removed %s, left by an interrupted run (%s bytes)", candidate, f"{size:,}")
        removed.append(candidate)
    return removed


def _glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def _remove(path: Path) -> int:
    if path.is_dir() and not path.is_symlink():
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        shutil.rmtree(path)
        return size
    size = path.stat().st_size
    path.unlink()
    return size


class AtomicFile:
    """A file written under its temporary name and renamed into place by `commit()`; `abort()` (or
    leaving the `with` block by an exception) removes it. Stale temporaries of the same name are
    removed when it is opened.

    Use `commit()` directly when several files must appear in a chosen order (a dataset's `.bin`
    before its `.idx`)."""

    def __init__(self, path: str | os.PathLike, mode: str = "wb", *, encoding: str | None = None):
        if mode not in ("wb", "w"):
            raise ValueError(f"AtomicFile mode {mode!r}: use 'wb' or 'w'")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(self.path)
        self.temporary = temporary_path(self.path)
        if mode == "w":
            encoding = encoding or "utf-8"
        newline = "\n" if mode == "w" else None
        self.file: IO = open(self.temporary, mode, encoding=encoding, newline=newline)  # noqa: SIM115
        self.done = False

    def commit(self) -> Path:
        """Flushes, fsyncs and closes the temporary, then renames it to the final name."""
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.temporary, self.path)
        self.done = True
        return self.path

    def abort(self) -> None:
        self.file.close()
        self.temporary.unlink(missing_ok=True)
        self.done = True

    def __enter__(self) -> IO:
        return self.file

    def __exit__(self, exc_type, exc, traceback) -> None:
        if self.done:
            return
        if exc_type is None:
            self.commit()
        else:
            self.abort()


@contextmanager
def atomic_write(
    path: str | os.PathLike, mode: str = "wb", *, encoding: str | None = None
) -> Iterator[IO]:
    """`with atomic_write(path, "w") as f: f.write(...)`: `path` appears complete or not at all."""
    with AtomicFile(path, mode, encoding=encoding) as file:
        yield file


def write_text_atomically(path: str | os.PathLike, text: str) -> Path:
    with atomic_write(path, "w") as file:
        file.write(text)
    return Path(path)


def write_bytes_atomically(path: str | os.PathLike, data: bytes) -> Path:
    with atomic_write(path, "wb") as file:
        file.write(data)
    return Path(path)


def write_files_atomically(files: dict[Path, str | bytes]) -> None:
    """Writes every file under its temporary name first and renames them only when all are written,
    so a failure leaves none of them half-written (a vocabulary and its merges)."""
    pending = []
    try:
        for path, content in files.items():
            pending.append(AtomicFile(path, "w" if isinstance(content, str) else "wb"))
            pending[-1].file.write(content)
        for atomic in pending:
            atomic.commit()
    finally:
        for atomic in pending:
            if not atomic.done:
                atomic.abort()


@contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """`with atomic_directory(out) as tmp: write files into tmp`: on success `tmp` is renamed to
    `out` (an existing `out` is replaced); on an exception it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    temporary = temporary_path(path)
    if temporary.exists():
        _remove(temporary)
    temporary.mkdir()
    try:
        yield temporary
        replace_directory(temporary, path)
    except BaseException:
        if temporary.exists():
            shutil.rmtree(temporary, ignore_errors=True)
        raise


def replace_directory(finished: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Makes the complete folder `finished` appear as `path`: fsyncs its files, renames it into
    place and fsyncs the parent. An existing `path` stays whole until the rename: a folder cannot
    be renamed over a non-empty one, so the old one is first moved aside under a temporary name
    (a crash in between is cleaned up later) and removed after."""
    finished, path = Path(finished), Path(path)
    for file in finished.rglob("*"):
        if file.is_file():
            _fsync_path(file)
    if path.exists():
        old = path.with_name(f"{path.name}.tmp-{os.getpid()}-{_HOST}-old")
        os.replace(path, old)
        os.replace(finished, path)
        _remove(old)
    else:
        os.replace(finished, path)
    fsync_directory(path.parent)
    return path


def fsync_directory(path: str | os.PathLike) -> None:
    """Makes the renames inside a folder durable."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _fsync_path(path: Path) -> None:
    with open(path, "rb") as file:
        os.fsync(file.fileno())


class WriteFailed(OSError):
    """Writing an output failed; the message is the whole line to show (`run_app` prints it)."""


def free_bytes(path: str | os.PathLike) -> int | None:
    """Bytes an unprivileged writer can still use on the filesystem of `path` (or of its nearest
    existing parent); None when that cannot be read."""
    path = Path(path)
    for candidate in (path, *path.parents):
        try:
            stats = os.statvfs(candidate)
        except OSError:
            continue
        return stats.f_bavail * stats.f_frsize
    return None


def _size(num_bytes: int) -> str:
    if num_bytes < 1 << 20:
        return f"{num_bytes:,} bytes"
    return f"{num_bytes / 2**30:.1f} GiB" if num_bytes >= 1 << 30 else f"{num_bytes >> 20} MiB"


def _failed_write(error: BaseException, writer_error) -> tuple[int | None, str] | None:
    """(the OS error code, when known; the reason in words) of a failed write, or None when
    `error` is not one."""
    if isinstance(error, OSError) and not isinstance(error, WriteFailed):
        if error.errno:
            return error.errno, os.strerror(error.errno)
        return None, error.strerror or str(error)
    if not writer_error(error):
        return None
    # Writers that report a failed write their own way: torch.save's zip writer says only
    # "unexpected pos N vs M", safetensors quotes the OS error inside its own.
    quoted = _QUOTED_ERRNO.search(str(error))
    if quoted:
        return int(quoted.group(1)), os.strerror(int(quoted.group(1)))
    return None, (str(error).strip().splitlines() or [type(error).__name__])[0]


@contextmanager
def reporting_write_failures(
    folder: str | os.PathLike,
    *,
    doing: str,
    advice: str,
    writer_error: Callable[[BaseException], bool] = lambda error: False,  # noqa: ARG005
    reads_too: bool = False,
) -> Iterator[None]:
    """A write inside the block that fails (a full disk, a quota, a folder that cannot be made)
    ends as one line, `{doing} {folder}: {reason} (...); {advice}`, raised as `WriteFailed`; on a
    full disk the line says how much is free and to free some. OSErrors carry their reason;
    `writer_error` recognises the other exceptions of writers that report a failed write in
    their own words (torch.save, safetensors), which read as "No space left on device" when the
    filesystem has (almost) nothing left. A block that also reads (a reshape streaming its
    source) says `reads_too`: then only a full disk or quota (ENOSPC, EDQUOT) is reported so, and
    other errors pass as they are. Clean up after it, not inside it: the space is measured before
    the partial files go."""
    folder = Path(folder)
    try:
        yield
    except Exception as error:
        failed = _failed_write(error, writer_error)
        if failed is None:
            raise
        code, reason = failed
        free = free_bytes(folder)
        if code is None and free is not None and free < FULL_BELOW_BYTES:
            code, reason = errno.ENOSPC, os.strerror(errno.ENOSPC)
        elif code is None:
            reason = f"the write failed ({reason})"
        if reads_too and code not in (errno.ENOSPC, errno.EDQUOT):
            raise
        details = []
        if free is not None and code in (None, errno.ENOSPC, errno.EDQUOT):
            details.append(f"{_size(free)} free there")
        filename = getattr(error, "filename", None)
        if filename is not None and Path(filename) != folder:
            details.append(f"writing {filename}")
        if code in (errno.ENOSPC, errno.EDQUOT):
            advice = f"free some space there or {advice}"
        where = f" ({', '.join(details)})" if details else ""
        raise WriteFailed(f"{doing} {folder}: {reason}{where}; {advice}") from error


# flock(2) where the filesystem has no locks: Lustre mounted without `flock` (ENOSYS), some NFS
# set-ups (ENOLCK), FUSE filesystems (EOPNOTSUPP, which ENOTSUP equals on Linux).
_NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS})
# A holder writes who it is just after taking the lock: a reader that finds the file still empty
# waits this long for it.
_HOLDER_WAIT_SECONDS = 1.0
_COMMAND_SHOWN = 160  # characters of the holder's command line in the message


class FolderInUse(OSError):
    """Another live process holds the lock of `folder`; `holder` says who, in words (`pid 1234
    on host h, started 2026-01-02T03:04:05+00:00: mds-train --save ...`)."""

    def __init__(self, folder: Path, holder: str):
        super().__init__(
            f"{folder}: in use by another run ({holder}); wait for it to end or write elsewhere"
        )
        self.folder, self.holder = folder, holder


class FolderLock:
    """One run at a time in `folder`: an exclusive, non-blocking flock(2) on `folder/name`.

    The kernel drops the lock when the holding process ends, however it ends (`kill -9`, OOM),
    so a crashed run leaves nothing stuck; the file it leaves is taken over by the next run. The
    holder writes who it is into the file (pid, host, start time, `command`), which the refusal
    names. `release()` removes the file (and the folders `acquire()` made, when still empty); a
    run that took the lock meanwhile on the old file sees that its path now names another file
    and tries again. Where the filesystem has no locks, `acquire()` logs one warning and returns
    False: the run goes on unguarded. A process forked (not exec'd) while the lock is held shares
    it until it ends too."""

    def __init__(self, folder: str | os.PathLike, *, name: str, command: str | None = None):
        self.folder = Path(folder)
        self.path = self.folder / name
        self.command = command if command is not None else " ".join(sys.argv)
        self._descriptor: int | None = None
        self._made: list[Path] = []  # folders acquire() created, the innermost first

    @property
    def locked(self) -> bool:
        return self._descriptor is not None

    def acquire(self) -> bool:
        """Takes the lock: True when held, False when the filesystem cannot lock (warned);
        raises FolderInUse when another process holds it."""
        if self._descriptor is not None:
            return True
        while True:
            self._make_folder()
            try:
                descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:  # the folder was removed by a run releasing it: again
                continue
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder_description(descriptor)
                os.close(descriptor)
                raise FolderInUse(self.folder, holder) from None
            except OSError as error:
                os.close(descriptor)
                if error.errno not in _NO_LOCKS:
                    raise
                self.path.unlink(missing_ok=True)
                logger.warning(
                    "%s: the filesystem does not support file locks (%s); another run writing "
                    "into this folder at the same time would not be stopped",
                    self.folder,
                    os.strerror(error.errno),
                )
                return False
            if _names_file(self.path, descriptor):
                break
            os.close(descriptor)  # locked a file its holder removed on release: the path's now
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": self.command,
        }
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, (json.dumps(holder) + "\n").encode(), 0)
        self._descriptor = descriptor
        return True

    def release(self) -> None:
        """Removes the lock file, then drops the lock (in that order: no other run can hold
        the file while it goes), and the folders acquire() made if they are empty."""
        if self._descriptor is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        except OSError as error:
            logger.warning("could not remove %s: %s", self.path, error)
        os.close(self._descriptor)
        self._descriptor = None
        for folder in self._made:
            try:
                folder.rmdir()
            except OSError:  # not empty (the run's outputs, or another run's lock): stays
                break
        self._made = []

    def _make_folder(self) -> None:
        missing = [p for p in (self.folder, *self.folder.parents) if not p.exists()]
        self.folder.mkdir(parents=True, exist_ok=True)
        self._made = self._made or missing

    def __enter__(self) -> "FolderLock":
        self.acquire()
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        self.release()


def _names_file(path: Path, descriptor: int) -> bool:
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(descriptor)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _holder_description(descriptor: int) -> str:
    """Who holds the lock, from what it wrote into the file; read again for up to a second
    while the file is empty (the holder writes just after taking the lock)."""
    deadline = time.monotonic() + _HOLDER_WAIT_SECONDS
    while True:
        text = os.pread(descriptor, 1 << 16, 0).decode("utf-8", errors="replace").strip()
        if text or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    try:
        holder = json.loads(text)
        command = str(holder["command"])
        if len(command) > _COMMAND_SHOWN:
            command = command[:_COMMAND_SHOWN] + " ..."
        return (
            f"pid {holder['pid']} on host {holder['host']}, started {holder['started']}: {command}"
        )
    except (ValueError, KeyError, TypeError):
        return text.splitlines()[0][:_COMMAND_SHOWN] if text else "a process that did not say who"
