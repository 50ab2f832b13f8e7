"""`tritonkit loadtest` and `tritonkit route`, and the load flags `sweep` shares."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from tritonkit.clients import Client
from tritonkit.clients.router import RouterPolicy, parse_urls
from tritonkit.commandline import DEFAULT_REPO, DEFAULT_STATE, say, spec_arg
from tritonkit.configs.lengths_flag import with_lengths
from tritonkit.configs.loader import load_spec
from tritonkit.configs.steps import serve_configured
from tritonkit.errors import InputError, KitError, flag_problem
from tritonkit.files import write_bytes_atomic
from tritonkit.loadtests import pa_install
from tritonkit.loadtests.load import Load, RequestClass
from tritonkit.loadtests.measure import measure_by
from tritonkit.loadtests.pa_run import is_local
from tritonkit.loadtests.results import error_share, format_result, format_router, write_result
from tritonkit.loadtests.routed import measure_router, route_requests
from tritonkit.loadtests.server_probe import probe
from tritonkit.server import LocalTriton
from tritonkit.slo import ERROR_BOUND
from tritonkit.spec import ServerSpec

FREE_PORTS = {"http_port": 0, "grpc_port": 0, "metrics_port": 0}


def load_from(a: argparse.Namespace) -> Load:
    return Load.from_flags(a.rate, a.users, a.duration, a.warmup, a.arrival, a.shape)


def cmd_loadtest(a: argparse.Namespace) -> int:
    load, classes = load_from(a), RequestClass.from_flags(a.request_class)
    if a.router:
        return _loadtest_router(a, load, classes)
    if a.coalesce or a.duplicates is not None:
        raise InputError([flag_problem("--coalesce/--duplicates", "they shape traffic through a router: "
                                                                  "add --router HOST:PORT,HOST:PORT")])
    a.engine = a.engine or "locust"
    lengths_here(a)
    spec = with_lengths(load_spec(a.spec, a.repo), a.model, a.lengths)
    steps = spec.steps_of(a.model)  # a pipeline's models; an unknown name is an InputError listing the known ones
    steps = steps if spec.pipeline(a.model) else None
    if not 0 <= a.max_errors <= 1:
        raise InputError([flag_problem("--max-errors", "give a share within 0..1, e.g. 0.01 for 1%")])
    if a.shared_memory and (a.engine != "perf_analyzer" or (a.url and not is_local(a.url))):
        raise InputError([flag_problem("--shared-memory", "system shared memory is perf_analyzer's, with a server "
                                                          "on this machine: add --engine perf_analyzer, or drop it")])
    if a.url:  # a server that is already running; the spec only describes the model's inputs
        result = measure_by(a.engine, a.model, load, classes, url=a.url, metrics=a.metrics_url, log_dir=a.out,
                            input_data=a.input_data, steps=steps, shared_memory=a.shared_memory)
    else:
        with serve_configured(spec, a.repo, a.state_dir, models=[a.model], ports=FREE_PORTS, log=say) as r:
            e = r.endpoints
            url = e.http if a.engine == "locust" else e.grpc
            result = measure_by(a.engine, a.model, load, classes, url=url, metrics=e.metrics, log_dir=a.out,
                                input_data=a.input_data, steps=steps, shared_memory=a.shared_memory)
    say(format_result(result))
    js, cs = write_result(result, a.out)
    say(f"wrote {js} and {cs}")
    share = error_share(result)
    if share > a.max_errors:
        raise KitError(f"{share:.1%} of the requests failed, above --max-errors {a.max_errors:.1%} "
                       f"({', '.join(f'{k}: {v}' for k, v in result['overall']['errors'].items())}; "
                       f"the first of each kind is printed above)")
    return 0


def _loadtest_router(a: argparse.Namespace, load: Load, classes) -> int:
    """`loadtest --router`: the asyncio generator through a router over servers already running."""
    if a.engine == "locust":
        raise InputError([flag_problem("--engine locust", "--router sends with the asyncio engine: drop --engine "
                                                          "or pass --engine asyncio")])
    if a.url:
        raise InputError([flag_problem("--url", "give either --url (one server) or --router (several), not both")])
    urls, policy = parse_urls(a.router, "--router"), RouterPolicy.from_flags(a.deadline_ms, a.hedge, a.duplicates)
    result = measure_router(urls, a.model, load, classes, policy=policy, coalesce=a.coalesce,
                            duplicates=a.duplicates)
    say(format_result(result))
    js, cs = write_result(result, a.out)
    say(f"wrote {js} and {cs}")
    return 0


def cmd_route(a: argparse.Namespace) -> int:
    urls = parse_urls(a.endpoints, "--endpoints")
    policy = RouterPolicy.from_flags(a.deadline_ms, a.hedge, a.duplicates)
    if a.requests < 1 or a.concurrency < 1:
        raise InputError([flag_problem("--requests/--concurrency",
                                       "give at least 1 request and 1 concurrent sender")])
    section = route_requests(urls, a.model, a.requests, concurrency=a.concurrency, policy=policy,
                             coalesce=a.coalesce, duplicates=a.duplicates, priority=a.priority,
                             timeout_us=a.timeout_us, seed=a.seed)
    say("\n".join(format_router(section)))
    if a.json:
        write_bytes_atomic(a.json, json.dumps(section, indent=2).encode())
        say(f"wrote {a.json}")
    return 0


def load_args(sp: argparse.ArgumentParser, out: str) -> None:
    """The flags of a measured load (`loadtest`, `sweep`); Load.from_flags checks them."""
    spec_arg(sp)
    sp.add_argument("--model", required=True)
    sp.add_argument("--repo", type=Path, default=DEFAULT_REPO)
    sp.add_argument("--state-dir", type=Path, default=DEFAULT_STATE)
    sp.add_argument("--rps", "--rate", dest="rate", type=float,
                    help="open loop: arrivals per second (the name tune and slo.rps use; --rate is the same)")
    sp.add_argument("--arrival", choices=["poisson", "constant"], default="poisson")
    sp.add_argument("--users", type=int, help="closed loop: concurrent clients")
    sp.add_argument("--duration", type=float, default=10.0, help="steady window, seconds")
    sp.add_argument("--warmup", type=float, default=2.0, help="warm-up, seconds (not counted)")
    sp.add_argument("--shape", choices=["constant", "step", "ramp", "spike", "updown"], default="constant",
                    help="how the rate (or the users) moves over the steady window")
    sp.add_argument("--class", dest="request_class", action="append", metavar="NAME:WEIGHT:PRIO[:TIMEOUT_US]",
                    help="a request class (repeatable), e.g. interactive:1:1:50000 and bulk:3:2")
    sp.add_argument("--input-data", type=Path, metavar="FILE|DIR",
                    help="real request data to cycle through: perf_analyzer's --input-data JSON, or a folder "
                         "with NAME.npy per input (samples on axis 0); default: generated by the spec's rules")
    sp.add_argument("--lengths", action="append", metavar="NAME=DIST:...",
                    help="this run's length distribution for an input (repeatable), in place of the spec's "
                         "lengths: NAME=uniform:LOW:HIGH, NAME=loguniform:LOW:HIGH or "
                         "NAME=histogram:LEN=WEIGHT,LEN=WEIGHT (the kit's own server only)")
    sp.add_argument("--out", type=Path, default=Path(out))


def lengths_here(a: argparse.Namespace) -> None:
    """--lengths changes the config the kit generates: a server it did not start keeps its own."""
    if a.lengths and a.url:
        raise InputError([flag_problem("--lengths", "the lengths travel in the config the kit writes: set "
                                                    "inputs[].lengths in the spec and regenerate that server's "
                                                    "config, or drop --url")])


def _router_args(sp: argparse.ArgumentParser) -> None:
    """RouterPolicy.from_flags checks them."""
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


ROUTE_DESCRIPTION = (
    "Route requests over two or more running Triton servers (gRPC), the edge\n"
    "(local) one first.\n\n"
    "Each request goes where service time + network round trip is lowest: round trips\n"
    "come from health pings (which also open each channel before the first request),\n"
    "service times from the router's own requests: the P95 of the last half second once\n"
    "there are 20, else the median of the newest 3. On an error, or no answer within 5x\n"
    "an endpoint's expected latency, a request is retried on the next best endpoint\n"
    "inside its deadline (--deadline-ms). --hedge sends a second copy of a slow request\n"
    "within a budget of extra requests. A circuit breaker takes out an endpoint after 5\n"
    "consecutive errors and lets one request back in after 2 s. Another endpoint is explored once\n"
    "per 0.1 s x (its latency / the chosen one's), at most every 2 s and within 10% of\n"
    "requests, so one that recovered is back within a second.\n"
    "--coalesce lets identical requests in flight share one inference. Prints per\n"
    "endpoint: share, sent/ok/failed, retries and hedges taken, latency P50/P95, RTT,\n"
    "breaker state, and Triton's own inference and response-cache-hit counts.")


def cmd_probe(a: argparse.Namespace) -> int:
    traits = probe(a.state_dir, say, a.url)
    say(traits.describe())
    return 0


def local_server_version(state_dir: Path) -> str:
    """The version the local tritonserver reports, asked of one started with no models (the binary
    has no flag that prints it)."""
    with tempfile.TemporaryDirectory(prefix="tritonkit-version-") as repo, \
            LocalTriton(Path(repo), ServerSpec(http_port=0, grpc_port=0, metrics_port=0), state_dir) as server, \
            Client(server.endpoints.grpc) as client:
        return client.server_version()


def cmd_perf_analyzer(a: argparse.Namespace) -> int:
    version = a.server_version or local_server_version(a.state_dir / "version")
    pa = pa_install.find(version, log=say)
    say(f"perf_analyzer {pa.version}: {pa.binary}")
    return 0


def register(sub) -> None:
    sp = sub.add_parser("perf-analyzer", help="find NVIDIA's perf_analyzer for the server's version, installing it "
                                              "into the kit's cache when none is found; print where it is")
    sp.add_argument("--server-version", help="the Triton version to match (default: the local server's)")
    sp.add_argument("--state-dir", type=Path, default=DEFAULT_STATE)
    sp.set_defaults(func=cmd_perf_analyzer)

    sp = sub.add_parser("probe", help="measure whether the server keeps serving behind a bounded queue under "
                                      "overload (cached per server version; configs, validate and tune read it)")
    sp.add_argument("--url", help="gRPC HOST:PORT of a running server with explicit model control (default: the "
                                  "bundled server, started here)")
    sp.add_argument("--state-dir", type=Path, default=DEFAULT_STATE)
    sp.set_defaults(func=cmd_probe)

    sp = sub.add_parser("loadtest", help="measure a model under load (Locust headless): exact percentiles, "
                                         "server breakdown, generator health")
    load_args(sp, "out/loadtest")
    sp.add_argument("--engine", choices=["locust", "asyncio", "perf_analyzer"], default=None,
                    help="locust (default): tritonclient HTTP users, with classes and your own Locust scripts; "
                         "asyncio: the lighter gRPC generator, with classes, priorities and --router; "
                         "perf_analyzer: NVIDIA's C++ client, one class, the least CPU: prefer it where the "
                         "generator shares the cores with the server or you compare with Model Analyzer "
                         "(it stops at the first refused request)")
    sp.add_argument("--shared-memory", action="store_true",
                    help="with --engine perf_analyzer and a server on this machine: tensors through system shared "
                         "memory, as the tuner's trials send them (over gRPC, PA's export holds every request's "
                         "tensors: large inputs at high rates outgrow its memory)")
    sp.add_argument("--url", help="HOST:PORT of a running server (HTTP for locust, gRPC for asyncio); "
                                  "default: start one from the spec")
    sp.add_argument("--metrics-url", help="with --url: Triton's metrics URL, for its summary quantiles")
    sp.add_argument("--max-errors", type=float, default=ERROR_BOUND, metavar="SHARE",
                    help="exit with an error when more than this share of requests failed (default: %(default)g)")
    sp.add_argument("--router", metavar="HOST:PORT,HOST:PORT",
                    help="send through the router over these running servers' gRPC endpoints (edge first) with "
                         "the asyncio engine; the result gains each endpoint's share and latency")
    _router_args(sp)
    sp.set_defaults(func=cmd_loadtest)

    sp = sub.add_parser(
        "route", help="send requests through the edge/remote router and print where they went",
        formatter_class=argparse.RawDescriptionHelpFormatter, description=ROUTE_DESCRIPTION,
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
    _router_args(sp)
    sp.set_defaults(func=cmd_route)
