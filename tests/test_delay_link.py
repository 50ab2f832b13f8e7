"""The delay link the router tests and `bench routing` put between the router and the "cloud":
every chunk arrives D late in each direction, pipelined like a real link (not one after another)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import pytest

from tritonkit.loadtests.delay_link import DelayLink

DELAY_MS = 20.0
N = 40


@pytest.fixture
def echo():
    """A TCP echo server on the loopback, in a thread; closed when the test ends."""
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with contextlib.suppress(OSError):  # the thread ends when its socket is closed under it
            conn, _ = srv.accept()
            with conn:
                while data := conn.recv(4096):
                    conn.sendall(data)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield f"127.0.0.1:{srv.getsockname()[1]}"
    srv.close()


@pytest.mark.measures
def test_each_message_takes_one_round_trip_of_delay_even_when_sent_back_to_back(echo):
    """40 messages 1 ms apart on one connection: each comes back about 2 x 20 ms after it left. A
    link that delivered them one after another (each D after the one before) would return the last
    about (40 + 1) x 20 ms after the first was sent, ~780 ms after it left."""
    with DelayLink(echo, DELAY_MS) as link:
        host, _, port = link.url.rpartition(":")
        with socket.create_connection((host, int(port))) as c:
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sent_at, got_at, buf = [], [], b""
            for i in range(N):
                sent_at.append(time.perf_counter())
                c.sendall(bytes([i]))
                time.sleep(0.001)
            c.settimeout(5)
            while len(buf) < N:
                chunk = c.recv(64)
                now = time.perf_counter()
                got_at += [now] * len(chunk)
                buf += chunk
        proc = link.proc
    assert buf == bytes(range(N))
    rtts_ms = [(g - s) * 1e3 for s, g in zip(sent_at, got_at)]
    print("round trips, ms", [round(r, 1) for r in rtts_ms])
    assert min(rtts_ms) >= 2 * DELAY_MS  # the delay is never skipped, either way
    # pipelined, every message waits one round trip; delivered one after another, the last would wait
    # N of them. A quarter of that leaves a busy machine room for a stall and still tells them apart.
    assert max(rtts_ms) < N / 4 * 2 * DELAY_MS
    assert proc.poll() is not None  # the link's own process is gone with it


def test_a_bad_target_is_refused():
    with pytest.raises(ValueError, match="HOST:PORT"):
        DelayLink("no-port", 15)
