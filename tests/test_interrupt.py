"""Ctrl-C is never lost: a KeyboardInterrupt that something on the way swallowed still stops the
next step that checks (`tritonkit.interrupt`), and asyncio.run leaves SIGINT to the kit."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import asyncio, os, signal
from tritonkit import interrupt
signal.signal(signal.SIGINT, signal.default_int_handler)  # as on a terminal, whatever launched the suite
interrupt.install()
try:
    os.kill(os.getpid(), signal.SIGINT)
    signal.pause()  # the handler runs here: it raises at once
except KeyboardInterrupt:
    pass  # a library that turned it into an error of its own, or dropped it
async def main():
    assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    return 1
assert asyncio.run(main()) == 1  # asyncio.run did not install its own handler over the kit's
try:
    interrupt.check()
except KeyboardInterrupt:
    print("stopped at the next check")
"""


def test_a_swallowed_ctrl_c_stops_the_next_check():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stopped at the next check"
