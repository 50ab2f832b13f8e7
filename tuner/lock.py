"""One tuner per repository: an exclusive lock on a file in it, released when the process ends."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from tritonkit.errors import KitError

LOCK_FILE = ".tritonkit-tune.lock"


@contextlib.contextmanager
def repository_lock(repo: Path) -> Iterator[None]:
    """The kernel drops a flock when its holder dies, so a killed tuner never leaves a stale lock."""
    repo = Path(repo)
    repo.mkdir(parents=True, exist_ok=True)
    path = repo / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = Path(path).read_text().strip() or "another process"
            raise KitError(f"another tuner ({holder}) is working on {repo}; wait for it or stop it") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}".encode())
        yield
    finally:
        os.close(fd)
