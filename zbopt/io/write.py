"""Every file zbopt writes goes through `write_file`: whole or not at all.

A regular file is written to a temporary file beside it, flushed to disk, then put in its place by
`os.replace`, so a write that fails (a full disk, a file-size limit, an interrupt) names its path
and leaves the old file as it was. The new file keeps an old file's permission bits (a new one
gets the usual 0o666 less the umask; the owner is whoever writes). Through a symbolic link, the
file it names is replaced and the link kept. What is not a regular file (/dev/null, a FIFO, a
terminal) or is reached through /proc (/dev/stdout, /dev/fd/N) is written in place, as `open` does:
replacing it would swap a device node or a process's descriptor for a plain file.

`check_writable` says before any work whether `write_file` can create the file.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import BinaryIO

from zbopt.core.errors import ZboptError

__all__ = ["MAX_LINKS", "Content", "check_writable", "write_file"]

Content = str | bytes | Callable[[BinaryIO], None]  # text is written as UTF-8; a callable writes into the file
MAX_LINKS = 40  # as the kernel's limit on a chain of symbolic links


def write_file(path: str | Path, content: Content) -> Path:
    """Write `content` to `path` (see the module's docstring); a ZboptError naming the path and
    the reason when it cannot, the old file untouched."""
    path = Path(path)
    try:
        if _in_place(path):
            with open(path, "wb") as file:
                _put(file, content)
        else:
            _replace(Path(os.path.realpath(path)), content)
    except OSError as error:
        raise ZboptError(f"'{path}': cannot write ({error.strerror or error})") from None
    return path


def check_writable(path: str | Path) -> None:
    """A ZboptError naming `path` and why, unless `write_file` can write it: its directory exists
    and takes a new file (tried), an existing file is writable, it is not a directory."""
    path = Path(path)
    if path.is_dir():
        raise ZboptError(f"'{path}': is a directory")
    if path.exists() and not os.access(path, os.W_OK):
        raise ZboptError(f"'{path}': not writable")
    if path.exists() and _in_place(path):
        return
    folder = Path(os.path.realpath(path)).parent
    if not folder.is_dir():
        raise ZboptError(f"'{path}': no such directory")
    try:
        descriptor, temporary = _temporary(folder / path.name, 0o600)
    except OSError as error:
        raise ZboptError(f"'{path}': cannot create a file in '{folder}' ({error.strerror or error})") from None
    os.close(descriptor)
    os.unlink(temporary)


def _in_place(path: Path) -> bool:
    """Whether `path` is written in place: it exists and is not a regular file, or is reached
    through /proc (a process's descriptor: /dev/stdout, /dev/fd/1)."""
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            return True
    except OSError:
        return False
    step = Path(os.path.abspath(path))
    for _ in range(MAX_LINKS):
        step = Path(os.path.realpath(step.parent)) / step.name
        if step.parts[1:2] == ("proc",):
            return True
        if not step.is_symlink():
            return False
        step = step.parent / os.readlink(step)
    return False


def _replace(target: Path, content: Content) -> None:
    """Write a temporary file beside `target`, flushed to disk, then rename it over `target`."""
    try:
        mode = stat.S_IMODE(target.stat().st_mode) & 0o777
    except FileNotFoundError:
        mode = None
    descriptor, temporary = _temporary(target, 0o666)
    try:
        with os.fdopen(descriptor, "wb") as file:
            _put(file, content)
            file.flush()
            os.fsync(file.fileno())
            if mode is not None:
                os.fchmod(file.fileno(), mode)
        os.replace(temporary, target)
    except BaseException:
        with suppress(OSError):
            os.unlink(temporary)
        raise
    _sync_directory(target.parent)


def _temporary(target: Path, mode: int) -> tuple[int, Path]:
    """A new, hidden file beside `target` (the umask applies to `mode`, as for any new file)."""
    temporary = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    return os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), temporary


def _put(file: BinaryIO, content: Content) -> None:
    if callable(content):
        content(file)
    else:
        file.write(content.encode("utf-8") if isinstance(content, str) else content)


def _sync_directory(folder: Path) -> None:
    """Flush the rename to disk too (where the file system allows opening a directory)."""
    with suppress(OSError):
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
