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
    if keep_previous and path.exists():
        shutil.copy2(path, path.with_name(path.name + LAST_GOOD_SUFFIX))
    _replace(path, lambda f: f.write(data))
    return True


def copy_file_atomic(src: Path, dst: Path) -> bool:
    """Copy src to dst atomically, skipping the copy when dst already has the same bytes."""
    src, dst = Path(src), Path(dst)
    if dst.exists() and dst.stat().st_size == src.stat().st_size and _same_bytes(src, dst):
        return False
    with open(src, "rb") as s:
        _replace(dst, lambda f: shutil.copyfileobj(s, f, 1 << 20))
    return True


def _replace(path: Path, fill) -> None:
    """Write through `fill(file)` into a temp file beside `path`, fsync it, rename it over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; generated files are meant to be read by others
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


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
