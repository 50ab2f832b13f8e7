"""matplotlib, imported when a plot is drawn: it is a quarter of a second of every command's start,
and most commands (validate, configs, infer, the sidecar's loop) never draw one."""

from __future__ import annotations

import functools


@functools.cache
def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display on edge machines and in CI
    import matplotlib.pyplot as plt

    return plt
