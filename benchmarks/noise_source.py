"""A noisy neighbour: one core burnt in random bursts, about a third of the time, the way other pods,
a log shipper or thermal throttling take a shared edge node's CPU in spells of seconds.

`tritonkit bench versus --noise-source` runs every side of every case beside it, so that the kit and
Model Analyzer are compared on a box as noisy as a real node; `python -m
tritonkit.benchmarks.noise_source SECONDS` runs it alone (beside a CI run, say). The bursts last 0.5
to 4 s and each is followed by a quiet spell twice as long on average; the source writes each
burst to its log, so what it really took is reported, not assumed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

BUSY_SHARE = 1 / 3
BURST_S = (0.5, 4.0)

# The child: spin for a burst, sleep for about twice as long, write each burst as a line.
_CHILD = """
import json, random, sys, time
rng, log = random.Random(int(sys.argv[1])), open(sys.argv[2], "a", buffering=1)
low, high, quiet = float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
while True:
    burst = rng.uniform(low, high)
    start = time.monotonic()
    while time.monotonic() - start < burst:
        pass
    log.write(json.dumps({"at": start, "busy_s": burst}) + "\\n")
    time.sleep(rng.expovariate(1 / (quiet * burst)))
"""


@contextlib.contextmanager
def noise_source(log_path: Path, seed: int = 0, busy_share: float = BUSY_SHARE) -> Iterator[dict]:
    """Burn one core in bursts while the block runs; on exit the yielded dict holds what it took:
    seconds, busy seconds, the busy share and the bursts' count. The child is stopped by its own
    process id, whatever happened in the block."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("")
    quiet = (1 - busy_share) / busy_share  # the quiet spell's mean, in bursts' lengths
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(seed), str(log_path), str(BURST_S[0]),
                              str(BURST_S[1]), str(quiet)], stdin=subprocess.DEVNULL)
    started = time.monotonic()
    took: dict = {"pid": child.pid}
    try:
        yield took
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGKILL)
        child.wait()
        took.update(summary(log_path, time.monotonic() - started))


def summary(log_path: Path, seconds: float) -> dict:
    bursts = [json.loads(line) for line in Path(log_path).read_text().splitlines() if line.strip()]
    busy = sum(b["busy_s"] for b in bursts)
    return {"seconds": round(seconds, 1), "busy_s": round(busy, 1), "bursts": len(bursts),
            "busy_share": round(busy / seconds, 3) if seconds > 0 else 0.0}


def _interrupted(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    """SECONDS [LOG]: burn for that long, or until SIGINT or SIGTERM; print what it took."""
    for sig in (signal.SIGINT, signal.SIGTERM):  # a background job ignores SIGINT: stop on either
        signal.signal(sig, _interrupted)
    seconds = float(argv[0]) if argv else 3600.0
    log = Path(argv[1]) if len(argv) > 1 else Path("out/noise_source.log")
    with noise_source(log) as took, contextlib.suppress(KeyboardInterrupt):
        time.sleep(seconds)
    print(json.dumps(took))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
