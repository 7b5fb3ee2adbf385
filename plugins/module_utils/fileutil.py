# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Atomic file writes, the one implementation every part of the Core uses.

A temp file in the target's folder (created with the final mode, so a secret is never
readable by others, not even for a moment), written, fsynced, renamed over the target, then
the folder fsynced. A failure at any point leaves the previous file untouched and removes the
temp file: a reader sees the old content or the new one, never half of it (also after kill -9).
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from typing import BinaryIO, Iterator


@contextlib.contextmanager
def atomic_writer(path: str, mode: int = 0o600, exclusive: bool = False) -> Iterator[BinaryIO]:
    """``with atomic_writer(path) as f: f.write(...)``: the file appears when the block ends
    without an exception. With ``exclusive``, an existing file is never replaced: FileExistsError
    (a hard link into place, which fails if the name exists even when another process won a race)."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        if exclusive:
            try:
                os.link(tmp, path)
            finally:
                os.unlink(tmp)
        else:
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(directory)


def atomic_write(path: str, data: bytes, mode: int = 0o600, exclusive: bool = False) -> bool:
    """Writes data atomically. Returns False only when ``exclusive`` and the file exists."""
    try:
        with atomic_writer(path, mode, exclusive) as handle:
            handle.write(data)
    except FileExistsError:
        if exclusive:
            return False
        raise
    return True


def write_if_changed(path: str, data: bytes, mode: int = 0o600) -> bool:
    """Writes data atomically unless the file already holds exactly it with that mode.
    Returns whether anything changed."""
    try:
        with open(path, "rb") as handle:
            same = handle.read() == data
        if same:
            if os.stat(path).st_mode & 0o7777 == mode:
                return False
            os.chmod(path, mode)
            return True
    except FileNotFoundError:
        pass
    atomic_write(path, data, mode)
    return True


def fsync_dir(directory: str) -> None:
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    except OSError as err:
        if err.errno != errno.EINVAL:  # some file systems cannot fsync a folder
            raise
    finally:
        os.close(dir_fd)
