"""The one walk to a rate's edge: where a candidate stops holding, found in few verdicts.

Every search uses it: the offline tuner on request rates (`tuner/offline.py`), the traffic mix on
scales of its mix (`tuner/mix.py`), the tuner bench's grid (`benchmarks/tuner_bench.py`); what
"holds" means (one clear run, else a majority: `tuner/noise.py`, `settle`) is theirs to say
through `holds`.

From a value that holds, the edge is bracketed, then bisected: first the value a model predicts
(if it lies more than a step above), then steps that double in log while they hold, then the
geometric middle of the highest hold and the lowest miss, until the two are one `step` apart. A
climb in equal steps would take n verdicts for an edge n steps away; this takes about 2 log2 n.
From a value that misses, the walk goes down a step at a time, a few steps at most: a candidate
that holds nothing far below where it was expected to is not worth more measurements. A claim
measured again steps down the same way from the claim itself (`down_from`).
"""

from __future__ import annotations

import math
from collections.abc import Callable


def walk_up(hold: float, holds: Callable[[float], bool], step: float, more: Callable[[], bool],
            predicted: float | None = None) -> tuple[float, float | None]:
    """The highest value that held, and the lowest that missed (None: none missed before `more`
    said the budget is spent). `hold` held already; `holds(x)` measures x."""
    miss: float | None = None
    tries = [predicted] if predicted and predicted > hold * step else []
    factor = step
    while more():
        if miss is None and tries:
            x = tries.pop()
        elif miss is None:
            x, factor = hold * factor, factor * factor
        elif miss / hold > step * 1.001:
            x = math.sqrt(hold * miss)
        else:
            break
        if holds(x):
            hold = x
        else:
            miss = x
    return hold, miss


def walk_down(miss: float, holds: Callable[[float], bool], step: float, more: Callable[[], bool],
              max_steps: int) -> float | None:
    """The first value that holds below `miss` (which missed), one `step` at a time, `max_steps`
    at most; None when none did before the steps or the budget ran out."""
    return down_from(miss / step, holds, step, more, max_steps)


def down_from(start: float, holds: Callable[[float], bool], step: float, more: Callable[[], bool],
              max_steps: int) -> float | None:
    """The first of `start`, `start / step`, ... (`max_steps` values at most) that holds: a claim
    measured again, stepping down until it holds (the offline confirmation, the mix's, the grid's
    first rung); None when none did before the steps or the budget ran out."""
    x = start
    for _ in range(max_steps):
        if not more():
            break
        if holds(x):
            return x
        x /= step
    return None
