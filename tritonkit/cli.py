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
    from tritonkit.build_engines.artifacts import load_served_spec

    spec = load_served_spec(a.spec, a.repo)
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
    from tritonkit.build_engines.artifacts import load_served_spec
    from tritonkit.configs.generate import generate
    from tritonkit.serving import running

    spec = load_served_spec(a.spec, a.repo)
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
    from tritonkit.helm.deploy import deploy

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
    from tritonkit.build_engines.artifacts import load_served_spec
    from tritonkit.configs.generate import generate
    from tritonkit.serving import running

    spec = load_served_spec(a.spec, a.repo)
    spec.model(a.model)  # an unknown model is an InputError listing the known ones
    generate(a.spec, a.repo)
    ports = {"http_port": 0, "grpc_port": 0, "metrics_port": 0}
    return spec, running(spec, a.repo, a.state_dir, models=[a.model], ports=ports, log=say)


def cmd_loadtest(a: argparse.Namespace) -> int:
    from tritonkit.build_engines.artifacts import load_served_spec
    from tritonkit.loadtests.results import format_result, measure_by, write_result

    load, classes = _load_args(a), _classes(a)
    if a.router:
        return _loadtest_router(a, load, classes)
    if a.coalesce or a.duplicates is not None:
        raise InputError([_bad_arg("--coalesce/--duplicates", "they shape traffic through a router: "
                                                              "add --router HOST:PORT,HOST:PORT")])
    a.engine = a.engine or "locust"
    if a.url:  # a server that is already running; the spec only describes the model's inputs
        model_spec = load_served_spec(a.spec, a.repo).model(a.model)
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


def _router_policy(a: argparse.Namespace):
    """The router flags shared by `loadtest --router` and `route`, checked with the flag named."""
    from tritonkit.clients.router import RouterPolicy

    if a.deadline_ms <= 0:
        raise InputError([_bad_arg(f"--deadline-ms {a.deadline_ms:g}", "give a deadline above 0 ms, e.g. 2000")])
    if not 0 <= a.hedge <= 1:
        raise InputError([_bad_arg(f"--hedge {a.hedge:g}", "give a share within 0..1, e.g. 0.05 for at most "
                                                           "5% extra requests (0: no hedging)")])
    if a.duplicates is not None and not 0 <= a.duplicates < 1:
        raise InputError([_bad_arg(f"--duplicates {a.duplicates:g}", "give a share within 0..1 (below 1), "
                                                                     "e.g. 0.5 for half repeated payloads")])
    return RouterPolicy(deadline_s=a.deadline_ms / 1e3, hedge_budget=a.hedge)


def _loadtest_router(a: argparse.Namespace, load, classes) -> int:
    """`loadtest --router`: the asyncio generator through a router over servers already running."""
    from tritonkit.clients.router import parse_urls
    from tritonkit.loadtests.results import format_result, write_result
    from tritonkit.loadtests.routed import measure_router

    if a.engine == "locust":
        raise InputError([_bad_arg("--engine locust", "--router sends with the asyncio engine: drop --engine "
                                                      "or pass --engine asyncio")])
    if a.url:
        raise InputError([_bad_arg("--url", "give either --url (one server) or --router (several), not both")])
    urls, policy = parse_urls(a.router, "--router"), _router_policy(a)
    result = measure_router(urls, a.model, load, classes, policy=policy, coalesce=a.coalesce,
                            duplicates=a.duplicates)
    say(format_result(result))
    js, cs = write_result(result, a.out)
    say(f"wrote {js} and {cs}")
    return 0


def cmd_route(a: argparse.Namespace) -> int:
    from tritonkit.clients.router import parse_urls
    from tritonkit.loadtests.routed import format_router, route_requests

    urls, policy = parse_urls(a.endpoints, "--endpoints"), _router_policy(a)
    if a.requests < 1 or a.concurrency < 1:
        raise InputError([_bad_arg("--requests/--concurrency", "give at least 1 request and 1 concurrent sender")])
    section = route_requests(urls, a.model, a.requests, concurrency=a.concurrency, policy=policy,
                             coalesce=a.coalesce, duplicates=a.duplicates, priority=a.priority,
                             timeout_us=a.timeout_us, seed=a.seed)
    say("\n".join(format_router(section)))
    if a.json:
        import json

        from tritonkit.files import write_bytes_atomic

        write_bytes_atomic(a.json, json.dumps(section, indent=2).encode())
        say(f"wrote {a.json}")
    return 0


def cmd_sweep(a: argparse.Namespace) -> int:
    from tritonkit.tuner.sweep import BATCH_SIZES, sweep

    load = _load_args(a)
    spec, ctx = _served(a)
    sizes = [b for b in BATCH_SIZES if b <= a.max_batch]
    with ctx as r:
        say(f"sweep over max batch sizes {sizes}: {load.describe()}")
        files = sweep(r, spec, a.repo, a.model, load, a.out, batch_sizes=sizes, delays_us=a.delay_us, log=say)
    say(f"report: {files['report.md']}")
    return 0


def _check_tune_args(a: argparse.Namespace) -> None:
    checks = [("--p95-ms", a.p95_ms is None or a.p95_ms > 0, "give the P95 SLO in ms, above 0, e.g. 25"),
              ("--rps", a.rps is None or a.rps > 0, "give a rate above 0, e.g. 400"),
              ("--max-trials", a.max_trials >= 5, "allow at least 5 trials (calibration alone takes 3)"),
              ("--max-errors", 0 <= a.max_errors < 1, "give a ratio within 0..1, e.g. 0.01"),
              ("--max-batch", a.max_batch is None or a.max_batch >= 1, "give a max batch of at least 1"),
              ("--interval", a.interval > 0, "give a window above 0 s, e.g. 5"),
              ("--cooldown", a.cooldown >= 0, "give a cool-down of 0 s or more"),
              ("--duration", a.duration is None or a.duration > 0, "give a duration above 0 s, or leave it out")]
    problems = [_bad_arg(flag, fix) for flag, ok, fix in checks if not ok]
    if problems:
        raise InputError(problems)


def cmd_tune(a: argparse.Namespace) -> int:
    _check_tune_args(a)
    if a.online:
        from tritonkit.server import read_state
        from tritonkit.tuner.online import OnlineSettings, run_online

        # The server `tritonkit serve` started from here, unless --url names another one.
        local = read_state(a.state_dir)
        url = a.url or (local.grpc if local else "127.0.0.1:8001")
        headers = local.key_headers if local and local.grpc == url else None
        settings = OnlineSettings(interval_s=a.interval, cooldown_s=a.cooldown, dry_run=a.dry_run)
        run_online(a.spec, a.model, url, settings, repo=a.repo, p95_ms=a.p95_ms, duration_s=a.duration,
                   out_dir=a.out, key_headers=headers, log=say)
        return 0
    from tritonkit.tuner.run import tune_offline

    result = tune_offline(a.spec, a.model, a.repo or DEFAULT_REPO, a.state_dir, a.out, p95_ms=a.p95_ms, rps=a.rps,
                          max_trials=a.max_trials, max_error_ratio=a.max_errors, max_batch=a.max_batch, log=say)
    t = result.tuning
    say(f"\nbefore: {t.baseline.knobs.label()}  ->  after: {t.best.knobs.label()}")
    for name in ("report.md", "trials.json", "tuned.yaml"):
        if name in result.files:
            say(f"wrote {result.files[name]}")
    if not t.confirmed:
        say("no config met the SLO on a second measurement: nothing was changed (see the report)")
        return 1
    return 0


def cmd_bench(a: argparse.Namespace) -> int:
    if a.what == "generators":
        from tritonkit.loadtests.bench import run_bench

        run_bench(a.out, seconds=a.seconds, users=a.users, rate=a.rate, log=say)
        say(f"wrote {a.out / 'bench.json'}")
    elif a.what == "tuner":
        from tritonkit.spec import parse_spec
        from tritonkit.tuner.bench import run_tuner_bench

        model = a.model or parse_spec(a.spec).models[0].name
        run_tuner_bench(a.spec, model, a.repo, a.state_dir, a.out, max_trials=a.max_trials, log=say)
        say(f"wrote {a.out / 'bench_tuner.json'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tritonkit", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    def spec_arg(sp):
        sp.add_argument("--spec", type=Path, default=DEFAULT_SPEC, help="deploy.yaml (default: %(default)s)")

    sp = sub.add_parser("validate", help="check deploy.yaml and the ONNX files it names")
    spec_arg(sp)
    sp.add_argument("--repo", type=Path, default=DEFAULT_REPO,
                    help="repository `tritonkit build` wrote: its prepared graphs are checked instead of the originals")
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
        sp.add_argument("--shape", choices=["constant", "step", "ramp", "spike", "updown"], default="constant",
                        help="how the rate (or the users) moves over the steady window")
        sp.add_argument("--class", dest="request_class", action="append", metavar="NAME:WEIGHT:PRIO[:TIMEOUT_US]",
                        help="a request class (repeatable), e.g. interactive:1:1:50000 and bulk:3:2")
        sp.add_argument("--out", type=Path, default=Path(out))

    def router_args(sp):
        sp.add_argument("--deadline-ms", type=float, default=2000.0,
                        help="per-request deadline across all attempts (default: %(default)g)")
        sp.add_argument("--hedge", type=float, default=0.0, metavar="SHARE",
                        help="hedge slow requests on a second endpoint, at most this share of extra requests "
                             "(e.g. 0.05; default 0: off)")
        sp.add_argument("--coalesce", action="store_true",
                        help="identical requests in flight share one inference")
        sp.add_argument("--duplicates", type=float, default=None, metavar="SHARE",
                        help="send this share of requests as repeats of the latest payload (e.g. 0.5); "
                             "the others carry fresh random inputs")

    sp = sub.add_parser("loadtest", help="measure a model under load (Locust headless): exact percentiles, "
                                         "server breakdown, generator health")
    load_args(sp, "out/loadtest")
    sp.add_argument("--engine", choices=["locust", "asyncio"], default=None,
                    help="locust: tritonclient HTTP users (default); asyncio: the lighter gRPC generator "
                         "(the only one with --router)")
    sp.add_argument("--url", help="HOST:PORT of a running server (HTTP for locust, gRPC for asyncio); "
                                  "default: start one from the spec")
    sp.add_argument("--metrics-url", help="with --url: Triton's metrics URL, for its summary quantiles")
    sp.add_argument("--router", metavar="HOST:PORT,HOST:PORT",
                    help="send through the router over these running servers' gRPC endpoints (edge first) with "
                         "the asyncio engine; the result gains each endpoint's share and latency")
    router_args(sp)
    sp.set_defaults(func=cmd_loadtest)

    sp = sub.add_parser(
        "route", help="send requests through the edge/remote router and print where they went",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Route requests over two or more running Triton servers (gRPC), the edge\n"
                    "(local) one first.\n\n"
                    "Each request goes where P95(service time) + network round trip is lowest: service\n"
                    "times come from the router's own recent requests, round trips from health pings.\n"
                    "On an error, or no answer within 5x an endpoint's expected latency, it is retried\n"
                    "on the next best endpoint inside its deadline (--deadline-ms). --hedge sends a\n"
                    "second copy of a slow request within a budget of extra requests. A circuit breaker\n"
                    "takes out an endpoint after 5 consecutive failures and probes it back after 2 s;\n"
                    "5% of requests (at most 5/s per endpoint) explore another endpoint, so one that\n"
                    "recovered is measured again.\n"
                    "--coalesce lets identical requests in flight share one inference. Prints per\n"
                    "endpoint: share, sent/ok/failed, retries and hedges taken, latency P50/P95, RTT,\n"
                    "breaker state, and Triton's own inference and response-cache-hit counts.",
        epilog="example: tritonkit route --endpoints 127.0.0.1:8001,10.0.0.5:8001 --model edge_mlp "
               "--requests 500 --concurrency 8 --coalesce --duplicates 0.3")
    sp.add_argument("--endpoints", required=True, metavar="HOST:PORT,HOST:PORT",
                    help="gRPC endpoints, the edge (local) server first")
    sp.add_argument("--model", required=True)
    sp.add_argument("--requests", type=int, default=200, help="requests to send (default: %(default)s)")
    sp.add_argument("--concurrency", type=int, default=4, help="requests in flight (default: %(default)s)")
    sp.add_argument("--priority", type=int, default=0, help="Triton priority level (0: the model's default)")
    sp.add_argument("--timeout-us", type=int, default=None, help="Triton queue timeout, passed through")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--json", type=Path, help="also write the per-endpoint table as JSON here")
    router_args(sp)
    sp.set_defaults(func=cmd_route)

    sp = sub.add_parser("sweep", help="batch-size sweep with plots and a recommendation")
    load_args(sp, "out/sweep")
    sp.add_argument("--max-batch", type=int, default=64)
    sp.add_argument("--delay-us", type=int, action="append", help="queue delays to sweep (repeatable)")
    sp.set_defaults(func=cmd_sweep)

    sp = sub.add_parser("tune", help="rewrite config.pbtxt from measured P95: offline search or --online sidecar")
    spec_arg(sp)
    sp.add_argument("--model", required=True)
    sp.add_argument("--p95-ms", type=float, help="the P95 SLO (default: the model's slo.p95_ms)")
    sp.add_argument("--rps", type=float, help="offline: the lowest P95 at this rate (default: the highest rate "
                                              "that meets the SLO)")
    sp.add_argument("--max-trials", type=int, default=30, help="offline: measurement runs at most")
    sp.add_argument("--max-errors", type=float, default=0.01, help="offline: error ratio a trial may have")
    sp.add_argument("--max-batch", type=int, help="offline: the largest max batch to try (default: the spec's; "
                                                  "never above the memory plan's bound)")
    sp.add_argument("--repo", type=Path, help=f"the model repository (offline default: {DEFAULT_REPO}; online: "
                                               "accepted configs are also written there, so a restart keeps them)")
    sp.add_argument("--state-dir", type=Path, default=DEFAULT_STATE)
    sp.add_argument("--out", type=Path, default=Path("out/tune"))
    sp.add_argument("--online", action="store_true", help="watch a live server and adjust the queue delay and "
                                                          "preferred sizes within guardrails")
    sp.add_argument("--url", help="online: Triton's gRPC HOST:PORT (default 127.0.0.1:8001)")
    sp.add_argument("--metrics-url", help="online: accepted for the sidecar; the decisions use the statistics API")
    sp.add_argument("--dry-run", action="store_true", help="online: only log what would change")
    sp.add_argument("--interval", type=float, default=5.0, help="online: seconds per observation window")
    sp.add_argument("--cooldown", type=float, default=15.0, help="online: seconds between two changes")
    sp.add_argument("--duration", type=float, help="online: stop after this many seconds (default: until Ctrl-C)")
    sp.set_defaults(func=cmd_tune)

    sp = sub.add_parser("bench", help="benchmarks, printed as ratios measured in one run")
    sp.add_argument("what", choices=["generators", "tuner"],
                    help="generators: Locust HTTP vs asyncio gRPC capacity and distortion; "
                         "tuner: the tuner against an exhaustive grid over the same knobs")
    spec_arg(sp)
    sp.add_argument("--model", help="tuner: the model (default: the spec's first)")
    sp.add_argument("--repo", type=Path, default=DEFAULT_REPO)
    sp.add_argument("--state-dir", type=Path, default=DEFAULT_STATE)
    sp.add_argument("--max-trials", type=int, default=30, help="tuner: the tuner's trial budget")
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
