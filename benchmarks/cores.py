"""Server and generator on separate cores: overload and padding are the server's to handle, not
a contest between it and the load generator for the same cores of a small box."""

from __future__ import annotations

import contextlib
import os


def split_cores() -> tuple[set[int] | None, set[int] | None]:
    """(server cores, generator cores): halves of what this process may use; None on one core."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None, None
    half = len(cores) // 2
    return set(cores[:half]), set(cores[half:])


@contextlib.contextmanager
def pinned(cpus: set[int] | None):
    """This process on `cpus` for the context (a child started inside keeps them)."""
    before = os.sched_getaffinity(0)
    if cpus:
        os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
