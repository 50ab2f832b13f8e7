"""Where the python-backend runner spends an `execute`, for `tritonkit bench serving`.

Triton's statistics stop at the backend: its "infer" time covers the message to the stub, the
runner's Python and the ONNX Runtime call alike. When the server's environment names a folder in
`ENV`, each runner instance keeps cumulative counters in a small memory-mapped file there (one
per instance): adding to them is a memory write, no system call, so measuring costs next to
nothing, and a reader sees them at any moment. Unset (every ordinary run), the runner keeps none.

`tritonkit configs` copies this file beside the runner (like input_rules.py): it needs only numpy.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

ENV = "TRITONKIT_RUNNER_TIMINGS"
# executes: calls of execute; requests: requests they carried; ort_calls: session.run calls;
# execute_ns: wall time inside execute; ort_ns: wall time inside session.run.
FIELDS = ("executes", "requests", "ort_calls", "execute_ns", "ort_ns")
EXECUTES, REQUESTS, ORT_CALLS, EXECUTE_NS, ORT_NS = range(len(FIELDS))
SUFFIX = ".timings"


def counters(instance: str) -> np.ndarray | None:
    """The counters of one runner instance, zeroed; None when timings are off."""
    folder = os.environ.get(ENV)
    if not folder:
        return None
    Path(folder).mkdir(parents=True, exist_ok=True)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in instance)
    return np.memmap(Path(folder) / f"{safe}{SUFFIX}", dtype=np.int64, mode="w+", shape=(len(FIELDS),))


def read(folder: Path, prefix: str = "") -> dict[str, int]:
    """The counters of every instance whose name starts with `prefix`, summed."""
    total = np.zeros(len(FIELDS), dtype=np.int64)
    for path in sorted(Path(folder).glob(f"{prefix}*{SUFFIX}")):
        total += np.fromfile(path, dtype=np.int64, count=len(FIELDS))
    return dict(zip(FIELDS, (int(x) for x in total)))


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in FIELDS}
