"""The core's commands: `sample-model`, `serve` and `demo` (the whole loop)."""

from __future__ import annotations

import argparse
import signal
import time
from pathlib import Path

from tritonkit import sample_model
from tritonkit.commandline import DEFAULT_REPO, DEFAULT_STATE, port_overrides, say, spec_arg
from tritonkit.configs.gateway import limits_for, queues_said
from tritonkit.configs.loader import load_spec
from tritonkit.configs.steps import gateway_in_front, serve_configured
from tritonkit.demo import run_demo
from tritonkit.errors import KitError, raise_flag_problems
from tritonkit.spec import Spec, parse_spec
from tritonkit.support import local_triton


def cmd_sample_model(a: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    sample_model.write(a.out, width=a.width, layers=a.layers, seed=a.seed)
    say(f"wrote {a.out} ({a.layers} x {a.width}x{a.width} FP32 MLP, {a.out.stat().st_size / 2**20:.0f} MiB) "
        f"in {time.perf_counter() - t0:.1f} s")
    return 0


def served_names(spec: Spec, served: tuple[str, ...]) -> str:
    """What a server serves, as the banner says it: its models, then its pipelines."""
    pipelines = {p.name for p in spec.pipelines}
    models = [n for n in served if n not in pipelines]
    piped = [n for n in served if n in pipelines]
    said = f"{len(models)} model(s): {', '.join(models) or 'none'}"
    return said + (f"; {len(piped)} pipeline(s): {', '.join(piped)}" if piped else "")


def cmd_serve(a: argparse.Namespace) -> int:
    spec = load_spec(a.spec, a.repo)
    # the gateway's limits are checked before anything starts
    limits = limits_for(spec, list(spec.served()), local_triton()) if spec.server.gateway.enabled else None
    stop = {"signal": None}

    def on_signal(signum, _frame):
        stop["signal"] = signum

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with serve_configured(spec, a.repo, a.state_dir, ports=port_overrides(a), log=say) as r, \
            gateway_in_front(spec, r, a.state_dir, limits) as gw:
        ep = r.endpoints
        front = (f"  gateway  {gw.url} (Envoy: {gw.limits.describe()}; clients connect here)\n"
                 f"           {queues_said(spec)}\n" if gw else "")
        say(f"serving {served_names(spec, r.served)}\n{front}"
            f"  HTTP     http://{ep.http}\n  gRPC     {ep.grpc}\n  metrics  {ep.metrics}\n"
            f"  model control needs header {ep.key_header!r} (value in {a.state_dir}/server.json, or "
            f"${spec.server.restricted_key.value_env})\nCtrl-C stops the server.")
        while stop["signal"] is None:
            if not r.server.alive():
                raise KitError(f"tritonserver exited unexpectedly: {r.server.failure_reason()}")
            if gw and not gw.envoy.alive():
                raise KitError(f"the gateway (envoy) exited unexpectedly (log: {gw.envoy.log_path})")
            time.sleep(0.2)
        say("stopping ...")
    return 0


def cmd_demo(a: argparse.Namespace) -> int:
    raise_flag_problems([
        ("--seconds", a.seconds >= 1, "give each load window in seconds, at least 1, e.g. 4"),
        ("--tune-trials", a.tune_trials >= 5, "allow at least 5 trials (calibration alone takes 3)"),
    ])
    # Parsed only: the demo writes the sample model first, then checks the graphs (run_demo).
    run_demo(parse_spec(a.spec), a.repo, a.state_dir, requests=a.requests, concurrency=a.concurrency, out=a.out,
             seconds=a.seconds, tune_trials=a.tune_trials)
    return 0


def register(sub) -> None:
    sp = sub.add_parser("sample-model", help="write the sample ONNX model (an MLP; no downloads)")
    sp.add_argument("--out", type=Path, default=Path("models/edge_mlp.onnx"))
    sp.add_argument("--width", type=int, default=2048)
    sp.add_argument("--layers", type=int, default=4)
    sp.add_argument("--seed", type=int, default=0)
    sp.set_defaults(func=cmd_sample_model)

    sp = sub.add_parser("serve", help="serve the spec's models with a local tritonserver until Ctrl-C")
    spec_arg(sp)
    sp.add_argument("--repo", type=Path, default=DEFAULT_REPO)
    sp.add_argument("--state-dir", type=Path, default=DEFAULT_STATE)
    for port in ("http-port", "grpc-port", "metrics-port"):
        sp.add_argument(f"--{port}", type=int, help=f"override server.{port.replace('-', '_')} (0: a free port)")
    sp.set_defaults(func=cmd_serve)


def register_demo(sub) -> None:
    sp = sub.add_parser("demo", help="the whole loop on this machine with a real tritonserver")
    spec_arg(sp)
    sp.add_argument("--repo", type=Path, default=DEFAULT_REPO)
    sp.add_argument("--state-dir", type=Path, default=DEFAULT_STATE)
    sp.add_argument("--requests", type=int, default=2000)
    sp.add_argument("--concurrency", type=int, default=16)
    sp.add_argument("--out", type=Path, default=Path("out/demo"), help="load test and sweep results")
    sp.add_argument("--seconds", type=float, default=4.0, help="length of the load test and of each sweep row")
    sp.add_argument("--tune-trials", type=int, default=14, help="the tuner's trial budget (step 7)")
    sp.set_defaults(func=cmd_demo)
