"""Atomic file writes: a reader (or Triton) sees the old file or the new one, never half of one."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

LAST_GOOD_SUFFIX = ".last-good"


def write_bytes_atomic(path: Path, data: bytes, keep_previous: bool = False) -> bool:
    """Write `data` to `path` via temp file + fsync + rename. Returns False if nothing changed.

    An unchanged file is not touched (same bytes, same mtime), so regenerating from an unchanged
    spec is a no-op. With `keep_previous`, the file being replaced is kept as `<path>.last-good`.
    """
    path = Path(path)
    if path.exists() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if keep_previous and path.exists():
            shutil.copy2(path, path.with_name(path.name + LAST_GOOD_SUFFIX))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return True


def copy_file_atomic(src: Path, dst: Path) -> bool:
    """Copy src to dst atomically, skipping the copy when dst already has the same bytes."""
    src, dst = Path(src), Path(dst)
    if dst.exists() and dst.stat().st_size == src.stat().st_size and _same_bytes(src, dst):
        return False
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, dst)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(dst.parent)
    return True


def _same_bytes(a: Path, b: Path, chunk: int = 1 << 20) -> bool:
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(chunk), fb.read(chunk)
            if x != y:
                return False
            if not x:
                return True


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
