"""Atomic file writes, the one home of "a temporary file in the same folder, then os.replace".

A reader (another process, a run resumed after a kill, a report rebuilt mid-sweep) sees either
the old file or the new one, never half of one. The temporary file is a hidden sibling of the
target, `.NAME.PID.N.tmp` (same folder, so same filesystem, which os.replace needs to be
atomic; unique to the process and the call, so two processes writing the same file never
rename each other's half); it is removed when the write fails. It is created with the umask's
permissions, like any other output. A process killed outright (SIGKILL) mid-write may leave
one behind: `remove_stale` clears them for a file only one process writes (checkpoints).

`atomic_path` is for writers that need a path (torch.save, matplotlib, tokenizers' save,
os.link); `atomic_open` for writers that take an open file; `atomic_write_text` and
`atomic_write_bytes` for a whole content at once. Callers create the folder themselves.
"""
from __future__ import annotations

import contextlib
import itertools
import os
from pathlib import Path
from typing import IO, Any, Iterator, Union

StrPath = Union[str, os.PathLike]

_serial = itertools.count()  # unique temporary names within a process (threads, nested writes)


def temp_sibling(path: StrPath) -> Path:
    """The hidden temporary name next to PATH that the functions below write first."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.{next(_serial)}.tmp")


def remove_stale(path: StrPath) -> None:
    """Remove temporary files of PATH left by a writer killed mid-write. Only for a file that one
    process writes at a time: another writer's temporary file would go from under it."""
    path = Path(path)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        stale.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_path(path: StrPath, fsync: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to PATH for the caller to write; on success it replaces PATH
    (after an fsync of its data when `fsync`), on any exception it is removed and PATH is left as
    it was."""
    path = Path(path)
    tmp = temp_sibling(path)
    tmp.unlink(missing_ok=True)  # a leftover of a killed process that had this pid
    try:
        yield tmp
        if fsync:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_open(path: StrPath, mode: str = "w", fsync: bool = False, **kwargs: Any) -> Iterator[IO[Any]]:
    """open() a temporary file next to PATH for writing (MODE "w" or "wb"; KWARGS go to open:
    encoding, newline); when the block ends without an exception the file is closed (flushed and
    fsynced first when `fsync`) and replaces PATH, else it is removed."""
    if mode not in ("w", "wt", "wb"):
        raise ValueError(f"atomic_open writes a whole file: mode 'w' or 'wb', not {mode!r}")
    with atomic_path(path) as tmp, open(tmp, mode, **kwargs) as f:
        yield f
        if fsync:
            f.flush()
            os.fsync(f.fileno())


def atomic_write_text(path: StrPath, text: str, encoding: str = "utf-8", newline: str | None = None) -> None:
    """PATH holds TEXT, written atomically."""
    with atomic_open(path, "w", encoding=encoding, newline=newline) as f:
        f.write(text)


def atomic_write_bytes(path: StrPath, data: bytes, fsync: bool = False) -> None:
    """PATH holds DATA, written atomically."""
    with atomic_open(path, "wb", fsync=fsync) as f:
        f.write(data)
