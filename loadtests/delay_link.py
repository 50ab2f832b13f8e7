"""A network link with a fixed delay, for the router's tests and `tritonkit bench routing`.

    router ──► 127.0.0.1:PORT ══ every chunk D ms late ══► Triton (and D ms late on the way back)

A TCP proxy on the loopback: each chunk read from one side is written to the other `delay_ms`
after it arrived, in each direction. It is pipelined like a real link (a chunk waits for its own
due time, not for the chunks before it to be delivered), so a 15 ms link is a 30 ms round trip
whatever the number of requests in flight, and connection set-up pays the delay as well.

`tc netem` in a network namespace would do this in the kernel, but this machine's kernel is built
without it (CONFIG_NET_SCH_NETEM), so the proxy runs as its own process (`python -m` this module),
away from the client's event loop and interpreter lock, and is stopped by its own pid.
Standard library only: it starts in a fraction of a second.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys

READY = "delay-link listening on port "


async def _carry(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    """One direction: read as fast as it comes, deliver each chunk at its own arrival + delay."""
    loop = asyncio.get_running_loop()
    due: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            at, data = await due.get()
            if (wait := at - loop.time()) > 0:
                await asyncio.sleep(wait)
            if not data:
                with contextlib.suppress(OSError):
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(deliver())
    try:
        while data := await reader.read(1 << 16):
            due.put_nowait((loop.time() + delay_s, data))
    except OSError:
        pass
    due.put_nowait((loop.time() + delay_s, b""))  # the close travels the link too
    with contextlib.suppress(OSError):
        await sender


async def _serve(listen_port: int, host: str, port: int, delay_s: float) -> None:
    async def connection(c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        try:
            s_reader, s_writer = await asyncio.open_connection(host, port)
        except OSError:
            c_writer.close()
            return
        try:
            await asyncio.gather(_carry(c_reader, s_writer, delay_s), _carry(s_reader, c_writer, delay_s))
        finally:
            for w in (c_writer, s_writer):
                w.close()

    server = await asyncio.start_server(connection, "127.0.0.1", listen_port)
    print(READY + str(server.sockets[0].getsockname()[1]), flush=True)
    async with server:
        await server.serve_forever()


class DelayLink:
    """`with DelayLink("127.0.0.1:8001", delay_ms=15) as link: link.url` is the far end of a link
    with 15 ms each way (30 ms round trip) to that server."""

    def __init__(self, target: str, delay_ms: float):
        host, _, port = target.rpartition(":")
        if not host or not port.isdigit() or delay_ms < 0:
            raise ValueError(f"target must be HOST:PORT and delay_ms >= 0, not {target!r}, {delay_ms!r}")
        self.target, self.delay_ms = target, delay_ms
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> DelayLink:
        host, _, port = self.target.rpartition(":")
        self.proc = subprocess.Popen([sys.executable, "-m", __spec__.name, "--target", f"{host}:{port}",
                                      "--delay-ms", str(self.delay_ms)], stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith(READY):
            self.stop()
            raise RuntimeError(f"the delay link to {self.target} did not start (it printed {line!r})")
        self.url = f"127.0.0.1:{int(line[len(READY):])}"
        return self

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> DelayLink:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description="a TCP proxy on the loopback adding a delay in each direction")
    ap.add_argument("--target", required=True, help="HOST:PORT to forward to")
    ap.add_argument("--delay-ms", type=float, required=True, help="one-way delay, each direction")
    ap.add_argument("--port", type=int, default=0, help="port to listen on (default: a free one)")
    a = ap.parse_args()
    host, _, port = a.target.rpartition(":")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(a.port, host, int(port), a.delay_ms / 1e3))


if __name__ == "__main__":
    main()
