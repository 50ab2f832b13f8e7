"""Ctrl-C, remembered: the CLI's SIGINT handler raises KeyboardInterrupt as Python's own does, and
also records it, so that a long loop that measures (a tune's trials) stops at its next step even
where a library on the way turned the KeyboardInterrupt into an error of its own (a cancelled gRPC
call becomes a failed request) and the run went on. With a handler of the kit's own installed,
`asyncio.run` also leaves SIGINT alone instead of cancelling its task, the path where that happens.
"""

from __future__ import annotations

import signal
import threading

_seen = threading.Event()


def _on_sigint(signum, frame) -> None:
    _seen.set()
    raise KeyboardInterrupt


def install() -> None:
    """Take over SIGINT where Python's default handler has it (never where a command set its own, or
    where the parent ignored it)."""
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)


def check() -> None:
    """Raise KeyboardInterrupt if Ctrl-C came since the process started, whatever became of the first."""
    if _seen.is_set():
        raise KeyboardInterrupt
