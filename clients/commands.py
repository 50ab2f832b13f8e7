"""`tritonkit infer`: one request with random data matching the model's metadata."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from tritonkit.clients.client import Client
from tritonkit.commandline import DEFAULT_STATE, say
from tritonkit.errors import InputError, Problem
from tritonkit.server import read_state


def cmd_infer(a: argparse.Namespace) -> int:
    url = a.url
    if url is None:
        ep = read_state(a.state_dir)
        if ep is None:
            raise InputError([Problem(str(a.state_dir / "server.json"), "", "no running server started from here",
                                      "start one with `tritonkit serve` (or `make serve`), or pass --url HOST:PORT")])
        url = ep.grpc if a.protocol == "grpc" else ep.http
    with Client(url, a.protocol) as c:
        meta = c.metadata(a.model)
        arrays = meta.sampler(a.input_data, a.seed)(a.batch)
        t0 = time.perf_counter()
        out = c.infer(a.model, arrays, priority=a.priority, timeout_us=a.timeout_us)
        ms = (time.perf_counter() - t0) * 1e3
    say(f"{a.model} via {a.protocol} {url}: {ms:.2f} ms")
    for name, arr in arrays.items():
        say(f"  input  {name}: {list(arr.shape)} {arr.dtype}")
    for name, arr in out.items():
        say(f"  output {name}: {list(arr.shape)} {arr.dtype}")
    return 0


def register(sub) -> None:
    sp = sub.add_parser("infer", help="send one request: generated inputs by the model's rules, or real data")
    sp.add_argument("--model", required=True)
    sp.add_argument("--url", help="HOST:PORT (default: the server `tritonkit serve` started from here)")
    sp.add_argument("--protocol", choices=["grpc", "http"], default="grpc")
    sp.add_argument("--batch", type=int, default=1)
    sp.add_argument("--priority", type=int, default=0)
    sp.add_argument("--timeout-us", type=int, default=None)
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--input-data", type=Path, metavar="FILE|DIR",
                    help="send the first sample(s) of this real request data (perf_analyzer's --input-data JSON, "
                         "or a folder of NAME.npy) instead of generated inputs")
    sp.add_argument("--state-dir", type=Path, default=DEFAULT_STATE)
    sp.set_defaults(func=cmd_infer)
