"""The `tritonkit` command line. Each subcommand is a thin shell over a library function; errors
leave as one line per problem and an exit code (2: fix your input; 1: something failed)."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from tritonkit.errors import InputError, KitError

DEFAULT_SPEC = Path("deploy.yaml")
DEFAULT_REPO = Path("model_repository")
DEFAULT_STATE = Path(".tritonkit")


def say(msg: str) -> None:
    print(msg, flush=True)


def cmd_validate(a: argparse.Namespace) -> int:
    from tritonkit.spec import load_spec

    spec = load_spec(a.spec)
    say(f"{a.spec}: ok ({len(spec.models)} model(s): {', '.join(m.name for m in spec.models)})")
    return 0


def cmd_sample_model(a: argparse.Namespace) -> int:
    from tritonkit import sample_model

    t0 = time.perf_counter()
    sample_model.write(a.out, width=a.width, layers=a.layers, seed=a.seed)
    say(f"wrote {a.out} ({a.layers} x {a.width}x{a.width} FP32 MLP, {a.out.stat().st_size / 2**20:.0f} MiB) "
        f"in {time.perf_counter() - t0:.1f} s")
    return 0


def cmd_configs(a: argparse.Namespace) -> int:
    from tritonkit.configs.generate import generate

    for r in generate(a.spec, a.out, a.target, a.model or None):
        state = "updated" if r.changed else "unchanged"
        say(f"{r.config_path}: {state} (runtime {r.runtime})")
    return 0


def cmd_build(a: argparse.Namespace) -> int:
    from tritonkit.build_engines.build import build, table

    results = build(a.spec, a.out, a.model or None, a.target, a.cache_dir, force=a.force, log=say)
    say(table(results))
    return 0


def cmd_inspect(a: argparse.Namespace) -> int:
    from tritonkit.build_engines.inspect_graph import inspect_paths

    say(inspect_paths(a.onnx, a.spec, a.model or None))
    return 0


def _port_overrides(a: argparse.Namespace) -> dict[str, int]:
    return {k: v for k in ("http_port", "grpc_port", "metrics_port") if (v := getattr(a, k)) is not None}


def cmd_serve(a: argparse.Namespace) -> int:
    from tritonkit.configs.generate import generate
    from tritonkit.serving import running
    from tritonkit.spec import load_spec

    spec = load_spec(a.spec)
    generate(a.spec, a.repo)
    stop = {"signal": None}

    def on_signal(signum, _frame):
        stop["signal"] = signum

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with running(spec, a.repo, a.state_dir, ports=_port_overrides(a), log=say) as r:
        ep = r.endpoints
        say(f"serving {', '.join(m.name for m in spec.models)}\n"
            f"  HTTP     http://{ep.http}\n  gRPC     {ep.grpc}\n  metrics  {ep.metrics}\n"
            f"  model control needs header {ep.key_header!r} (value in {a.state_dir}/server.json, or "
            f"${spec.server.restricted_key.value_env})\nCtrl-C stops the server.")
        while stop["signal"] is None:
            if not r.server.alive():
                raise KitError(f"tritonserver exited unexpectedly: {r.server.failure_reason()}")
            time.sleep(0.2)
        say("stopping ...")
    return 0


def cmd_infer(a: argparse.Namespace) -> int:
    import numpy as np

    from tritonkit.clients import Client
    from tritonkit.server import read_state

    url = a.url
    if url is None:
        ep = read_state(a.state_dir)
        if ep is None:
            raise InputError([_no_server(a.state_dir)])
        url = ep.grpc if a.protocol == "grpc" else ep.http
    with Client(url, a.protocol) as c:
        meta = c.metadata(a.model)
        arrays = meta.random_inputs(a.batch, np.random.default_rng(a.seed))
        t0 = time.perf_counter()
        out = c.infer(a.model, arrays, priority=a.priority, timeout_us=a.timeout_us)
        ms = (time.perf_counter() - t0) * 1e3
    say(f"{a.model} via {a.protocol} {url}: {ms:.2f} ms")
    for name, arr in arrays.items():
        say(f"  input  {name}: {list(arr.shape)} {arr.dtype}")
    for name, arr in out.items():
        say(f"  output {name}: {list(arr.shape)} {arr.dtype}")
    return 0


def _no_server(state_dir: Path):
    from tritonkit.errors import Problem

    return Problem(str(state_dir / "server.json"), "", "no running server started from here",
                   "start one with `tritonkit serve` (or `make serve`), or pass --url HOST:PORT")


def cmd_demo(a: argparse.Namespace) -> int:
    from tritonkit.demo import run_demo

    run_demo(a.spec, a.repo, a.state_dir, requests=a.requests, concurrency=a.concurrency, out=a.out)
    return 0


def cmd_deploy(a: argparse.Namespace) -> int:
    from tritonkit.deploy import deploy

    if a.dry_run and a.out is None:
        a.out = Path("out/deploy")
    r = deploy(a.spec, a.repo, dry_run=a.dry_run, out=a.out, chart=a.chart, kubeconfig=a.kubeconfig,
               kube_context=a.kube_context, wait=a.wait, timeout_s=a.timeout, log=say)
    if r.notes:
        say("\n" + r.notes)
    return 0


def _load_args(a: argparse.Namespace):
    from tritonkit.loadtests.load import Load

    if not a.rate and not a.users:
        raise InputError([_bad_arg("--rate/--users", "give an arrival rate (--rate R) or a concurrency (--users N)")])
    if (a.rate is not None and a.rate <= 0) or (a.users is not None and a.users < 1) or a.duration <= 0:
        raise InputError([_bad_arg("--rate/--users/--duration", "use a rate > 0, users >= 1 and a duration > 0")])
    return Load(rate=a.rate, arrival=a.arrival, concurrency=a.users, duration_s=a.duration, warmup_s=a.warmup,
                shape=a.shape)


def _classes(a: argparse.Namespace):
    """--class NAME:WEIGHT:PRIORITY[:TIMEOUT_US[:BATCH]], repeatable; none: one default class."""
    from tritonkit.loadtests.load import OVERALL, RequestClass, check_class

    classes = []
    for text in a.request_class or []:
        parts = text.split(":")
        try:
            if not 3 <= len(parts) <= 5 or not parts[0] or parts[0] == OVERALL:
                raise ValueError("expected NAME:WEIGHT:PRIORITY[:TIMEOUT_US[:BATCH]]")
            timeout = int(parts[3]) if len(parts) > 3 and parts[3] else None
            batch = int(parts[4]) if len(parts) > 4 else 1
            classes.append(check_class(RequestClass(parts[0], float(parts[1]), int(parts[2]), timeout, batch),
                                       "--class"))
        except ValueError as e:
            raise InputError([_bad_arg(f"--class {text}", f"{e}; for example --class interactive:1:1:50000")]) \
                from None
    if len({c.name for c in classes}) != len(classes):
        raise InputError([_bad_arg("--class", "give each class its own name")])
    return classes or None


def _bad_arg(flag: str, fix: str):
    from tritonkit.errors import Problem

    return Problem("command line", flag, "missing or invalid", fix)


def _served(a: argparse.Namespace):
    """Generate the spec's configs and start a local server (free ports) with the model to measure."""
    from tritonkit.configs.generate import generate
    from tritonkit.serving import running
    from tritonkit.spec import load_spec

    spec = load_spec(a.spec)
    spec.model(a.model)  # an unknown model is an InputError listing the known ones
    generate(a.spec, a.repo)
    ports = {"http_port": 0, "grpc_port": 0, "metrics_port": 0}
    return spec, running(spec, a.repo, a.state_dir, models=[a.model], ports=ports, log=say)


def cmd_loadtest(a: argparse.Namespace) -> int:
    from tritonkit.loadtests.results import format_result, measure_by, write_result
    from tritonkit.spec import load_spec

    load, classes = _load_args(a), _classes(a)
    if a.url:  # a server that is already running; the spec only describes the model's inputs
        model_spec = load_spec(a.spec).model(a.model)
        result = measure_by(a.engine, model_spec, load, classes, url=a.url, metrics=a.metrics_url, log_dir=a.out)
    else:
        spec, ctx = _served(a)
        with ctx as r:
            e = r.endpoints
            url = e.http if a.engine == "locust" else e.grpc
            result = measure_by(a.engine, spec.model(a.model), load, classes, url=url, metrics=e.metrics,
                                log_dir=a.out)
    say(format_result(result))
    js, cs = write_result(result, a.out)
    say(f"wrote {js} and {cs}")
    return 0


def cmd_sweep(a: argparse.Namespace) -> int:
    from tritonkit.loadtests.sweep import BATCH_SIZES, sweep

    load = _load_args(a)
    spec, ctx = _served(a)
    sizes = [b for b in BATCH_SIZES if b <= a.max_batch]
    with ctx as r:
        say(f"sweep over max batch sizes {sizes}: {load.describe()}")
        files = sweep(r, spec, a.repo, a.model, load, a.out, batch_sizes=sizes, delays_us=a.delay_us, log=say)
    say(f"report: {files['report.md']}")
    return 0


def cmd_bench(a: argparse.Namespace) -> int:
    if a.what == "generators":
        from tritonkit.loadtests.bench import run_bench

        run_bench(a.out, seconds=a.seconds, users=a.users, rate=a.rate, log=say)
        say(f"wrote {a.out / 'bench.json'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tritonkit", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    def spec_arg(sp):
        sp.add_argument("--spec", type=Path, default=DEFAULT_SPEC, help="deploy.yaml (default: %(default)s)")

    sp = sub.add_parser("validate", help="check deploy.yaml and the ONNX files it names")
    spec_arg(sp)
    sp.set_defaults(func=cmd_validate)

    sp = sub.add_parser("sample-model", help="write the sample ONNX model (an MLP; no downloads)")
    sp.add_argument("--out", type=Path, default=Path("models/edge_mlp.onnx"))
    sp.add_argument("--width", type=int, default=2048)
    sp.add_argument("--layers", type=int, default=4)
    sp.add_argument("--seed", type=int, default=0)
    sp.set_defaults(func=cmd_sample_model)

    sp = sub.add_parser("configs", help="generate config.pbtxt and version folders")
    spec_arg(sp)
    sp.add_argument("--out", type=Path, default=DEFAULT_REPO)
    sp.add_argument("--target", choices=["local", "ngc"], default="local",
                    help="server the repository is for: the bundled local server or an NGC image")
    sp.add_argument("--model", action="append", help="only this model (repeatable)")
    sp.set_defaults(func=cmd_configs)

    sp = sub.add_parser("build", help="prepare and verify each model's ONNX, plan its profiles, build TensorRT "
                                      "engines where a GPU is present, then write the configs")
    spec_arg(sp)
    sp.add_argument("--out", type=Path, default=DEFAULT_REPO)
    sp.add_argument("--model", action="append", help="only this model (repeatable)")
    sp.add_argument("--target", choices=["local", "ngc"], default="local", help="as for `configs`")
    sp.add_argument("--cache-dir", type=Path, default=DEFAULT_STATE / "trt-cache", help="TensorRT timing cache")
    sp.add_argument("--force", action="store_true", help="rebuild even when nothing changed")
    sp.set_defaults(func=cmd_build)

    sp = sub.add_parser("inspect", help="inputs, outputs, dynamic dims and op counts of ONNX files")
    sp.add_argument("onnx", type=Path, nargs="*", help="ONNX files (default: the spec's models)")
    spec_arg(sp)
    sp.add_argument("--model", action="append", help="only this model of the spec (repeatable)")
    sp.set_defaults(func=cmd_inspect)

    sp = sub.add_parser("serve", help="serve the spec's models with a local tritonserver until Ctrl-C")
    spec_arg(sp)
    sp.add_argument("--repo", type=Path, default=DEFAULT_REPO)
    sp.add_argument("--state-dir", type=Path, default=DEFAULT_STATE)
    for port in ("http-port", "grpc-port", "metrics-port"):
        sp.add_argument(f"--{port}", type=int, help=f"override server.{port.replace('-', '_')} (0: a free port)")
    sp.set_defaults(func=cmd_serve)

    sp = sub.add_parser("infer", help="send one request with random data matching the model's metadata")
    sp.add_argument("--model", required=True)
    sp.add_argument("--url", help="HOST:PORT (default: the server `tritonkit serve` started from here)")
    sp.add_argument("--protocol", choices=["grpc", "http"], default="grpc")
    sp.add_argument("--batch", type=int, default=1)
    sp.add_argument("--priority", type=int, default=0)
    sp.add_argument("--timeout-us", type=int, default=None)
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--state-dir", type=Path, default=DEFAULT_STATE)
    sp.set_defaults(func=cmd_infer)

    def load_args(sp, out: str):
        spec_arg(sp)
        sp.add_argument("--model", required=True)
        sp.add_argument("--repo", type=Path, default=DEFAULT_REPO)
        sp.add_argument("--state-dir", type=Path, default=DEFAULT_STATE)
        sp.add_argument("--rate", type=float, help="open loop: arrivals per second")
        sp.add_argument("--arrival", choices=["poisson", "constant"], default="poisson")
        sp.add_argument("--users", type=int, help="closed loop: concurrent clients")
        sp.add_argument("--duration", type=float, default=10.0, help="steady window, seconds")
        sp.add_argument("--warmup", type=float, default=2.0, help="warm-up, seconds (not counted)")
        sp.add_argument("--shape", choices=["constant", "step", "ramp", "spike"], default="constant",
                        help="how the rate (or the users) moves over the steady window")
        sp.add_argument("--class", dest="request_class", action="append", metavar="NAME:WEIGHT:PRIO[:TIMEOUT_US]",
                        help="a request class (repeatable), e.g. interactive:1:1:50000 and bulk:3:2")
        sp.add_argument("--out", type=Path, default=Path(out))

    sp = sub.add_parser("loadtest", help="measure a model under load (Locust headless): exact percentiles, "
                                         "server breakdown, generator health")
    load_args(sp, "out/loadtest")
    sp.add_argument("--engine", choices=["locust", "asyncio"], default="locust",
                    help="locust: tritonclient HTTP users (default); asyncio: the lighter gRPC generator")
    sp.add_argument("--url", help="HOST:PORT of a running server (HTTP for locust, gRPC for asyncio); "
                                  "default: start one from the spec")
    sp.add_argument("--metrics-url", help="with --url: Triton's metrics URL, for its summary quantiles")
    sp.set_defaults(func=cmd_loadtest)

    sp = sub.add_parser("sweep", help="batch-size sweep with plots and a recommendation")
    load_args(sp, "out/sweep")
    sp.add_argument("--max-batch", type=int, default=64)
    sp.add_argument("--delay-us", type=int, action="append", help="queue delays to sweep (repeatable)")
    sp.set_defaults(func=cmd_sweep)

    sp = sub.add_parser("bench", help="benchmarks, printed as ratios measured in one run")
    sp.add_argument("what", choices=["generators"], help="generators: Locust HTTP vs asyncio gRPC capacity "
                                                          "and distortion")
    sp.add_argument("--out", type=Path, default=Path("out/bench"))
    sp.add_argument("--seconds", type=float, default=5.0, help="steady window of each run")
    sp.add_argument("--users", type=int, default=16, help="closed-loop clients for the capacity runs")
    sp.add_argument("--rate", type=float, default=200.0, help="open-loop rate for the distortion runs")
    sp.set_defaults(func=cmd_bench)

    sp = sub.add_parser("demo", help="the whole loop on this machine with a real tritonserver")
    spec_arg(sp)
    sp.add_argument("--repo", type=Path, default=DEFAULT_REPO)
    sp.add_argument("--state-dir", type=Path, default=DEFAULT_STATE)
    sp.add_argument("--requests", type=int, default=2000)
    sp.add_argument("--concurrency", type=int, default=32)
    sp.add_argument("--out", type=Path, default=Path("out/demo"), help="load test and sweep results")
    sp.set_defaults(func=cmd_demo)

    sp = sub.add_parser("deploy", help="build engines (GPU), generate configs, helm upgrade --install the chart "
                                       "into the current kube context (values from deploy.yaml's deploy block)")
    spec_arg(sp)
    sp.add_argument("--repo", type=Path, default=DEFAULT_REPO)
    sp.add_argument("--dry-run", action="store_true", help="render and check only; no cluster needed")
    sp.add_argument("--out", type=Path, help="write the rendered manifests here (default with --dry-run: out/deploy)")
    sp.add_argument("--chart", type=Path, help="chart folder (default: helm/triton-edge of the kit)")
    sp.add_argument("--kubeconfig", type=Path, help="default: $KUBECONFIG, then ~/.kube/config")
    sp.add_argument("--kube-context", help="default: the kubeconfig's current context")
    sp.add_argument("--wait", action="store_true", help="wait until the pods are ready")
    sp.add_argument("--timeout", type=int, default=600, help="seconds for helm (and --wait)")
    sp.set_defaults(func=cmd_deploy)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except InputError as e:
        for problem in e.problems:
            print(f"tritonkit: error: {problem}", file=sys.stderr)
        return e.exit_code
    except KitError as e:
        print(f"tritonkit: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("tritonkit: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
