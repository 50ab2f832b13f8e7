"""The gateway in front of Triton: an Envoy bootstrap generated from Envoy's own API types.

Admission is Envoy's cluster circuit breaker: at most `max_requests` requests in flight to Triton
(gRPC over HTTP/2 to its gRPC port, HTTP/1.1 to its HTTP port, each upstream with that limit), the
excess answered at once (gRPC UNAVAILABLE, HTTP 503) instead of waiting in Triton's queue past its
SLO. Interactive requests (a `x-tritonkit-class: interactive` header)
take a route of priority HIGH, whose threshold is separate, so a flood of bulk traffic never
refuses them. The route timeout is the deadline: a request still unanswered then is cancelled
upstream and answered with an error, never late. With `adaptive`, Envoy's adaptive concurrency
filter moves the bulk limit with the latency it measures (a Jetson's thermal limits move capacity);
interactive requests and model control skip it.

The config is built from `envoy-data-plane` (Envoy's protobuf API as Python classes), the way
`config.pbtxt` is built from Triton's protobuf: a field Envoy does not have fails here, not when
Envoy starts.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from tritonkit.errors import InputError, Problem
from tritonkit.files import write_bytes_atomic
from tritonkit.spec import ModelSpec, Spec
from tritonkit.support import cancels_safely

ADAPTIVE_SHARE = 0.9  # of the SLO, where the adaptive filter's P95 should settle (`adaptive_target_ms`)
RTT_BUFFER = 25.0  # percent over the minimum RTT the gradient tolerates (Envoy's default, set explicitly)
BURST_SDS = 3  # room above the mean in flight: a limit there refuses about 1 request in 1000 at the claim
CLASS_HEADER = "x-tritonkit-class"  # the request class a client sends; "interactive" takes the HIGH route
ADAPTIVE_FILTER = "envoy.filters.http.adaptive_concurrency"
UPSTREAM = "triton"  # its gRPC port
UPSTREAM_HTTP = "triton_http"
UPSTREAM_PROBE = "triton_probe"  # the same HTTP port, outside admission
UPSTREAM_METRICS = "triton_metrics"


def queues_behind(m: ModelSpec) -> ModelSpec:
    """`m` as it is served behind the gateway: its priority levels (two, where it has none and need
    not answer in order, so that interactive requests go first among those admitted) and no queue
    policy, which would refuse before Envoy does, and slowly (its timeout; on 2.51 also its 500 ms
    stall behind a full queue)."""
    b = m.batching
    levels = b.priority_levels if b.preserve_ordering else max(2, b.priority_levels)
    b = b.model_copy(update={"priority_levels": levels, "default_priority": b.default_priority or levels,
                             "default_queue_policy": None, "priority_queue_policies": {}})
    return m.model_copy(update={"batching": b})


def drops_queue_policies(spec: Spec) -> bool:
    g = spec.server.gateway
    return g.enabled and not g.keep_queue_policies


def behind_gateway(spec: Spec) -> Spec:
    """The spec as its server is configured: every batching model `queues_behind` the gateway where
    the spec turns it on (and does not keep the policies); else `spec` itself."""
    if not drops_queue_policies(spec):
        return spec
    models = [queues_behind(m) if m.batching.enabled and m.max_batch_size > 0 else m for m in spec.models]
    if models == spec.models:
        return spec
    behind = Spec(spec.data.model_copy(update={"models": models}), spec.path, spec.shown, spec.source)
    # levels of at least two with their default among them, and no policy, break no rule a checked
    # spec kept: checking it again would only read its ONNX graphs again
    behind.checked = spec.checked
    return behind


def queues_said(spec: Spec) -> str:
    """What `serve`'s banner says of Triton's queues behind the gateway."""
    if not drops_queue_policies(spec):
        return "Triton's queue policies as the spec writes them (server.gateway.keep_queue_policies)"
    return "Triton's queues: priority levels, no queue policy (Envoy refuses the overload)"


def in_flight_limit(rate_rps: float, time_ms: float, burst_sds: float = BURST_SDS) -> int:
    """Little's law with room for bursts: L = rate x time requests are in flight on average, and
    under Poisson arrivals their count is itself Poisson (mean and variance L), so the limit is
    L + burst_sds x sqrt(L). The room admits the claim's bursts; under overload the breaker keeps
    the whole limit in flight, and each answer waits about limit / throughput, so room above L is
    wait above the time measured at the claim. So this is only where the measured limit's search
    starts from above (`tuner/in_flight.py`; `bench overload` compares them)."""
    mean = rate_rps * time_ms / 1000
    return max(1, math.ceil(mean + burst_sds * math.sqrt(mean)))


def adaptive_target_ms(slo_ms: float, limit: int) -> float:
    """The P95 to give Envoy's gradient so that it settles at ADAPTIVE_SHARE of the SLO. Each update
    sets limit' = g x limit + sqrt(g x limit), g = target / sampled P95, so a steady limit L has
    g x L = x with x + sqrt(x) = L: the sampled P95 settles at target x L / x, above the target (by
    a sixth at L = 40, by 42% at L = 8). `limit` (the fixed one, the claim's scale) stands for L."""
    x = ((math.sqrt(1 + 4 * limit) - 1) / 2) ** 2
    return ADAPTIVE_SHARE * slo_ms * x / limit


@dataclass(frozen=True)
class GatewayLimits:
    """What the gateway admits: requests in flight per priority, and the deadline of each."""

    max_requests: int  # bulk and default traffic in flight to Triton (the DEFAULT threshold)
    max_requests_high: int  # interactive traffic in flight (the HIGH threshold)
    timeout_ms: float | None  # a request not answered by then is cancelled and refused; None: no deadline
    adaptive: bool = False  # Envoy's adaptive concurrency filter in front of the fixed limit
    # The P95 the adaptive filter steers to (`adaptive_target_ms`). Envoy's own is its minimum RTT
    # (sampled at one request in flight) plus 25%, which a batching server meets only far below its
    # throughput; None keeps that.
    target_p95_ms: float | None = None

    def describe(self) -> str:
        deadline = f"deadline {self.timeout_ms:g} ms" if self.timeout_ms else "no deadline"
        adaptive = ""
        if self.adaptive:
            adaptive = f", adaptive to P95 {self.target_p95_ms:g} ms" if self.target_p95_ms else ", adaptive"
        return f"{self.max_requests} bulk + {self.max_requests_high} interactive in flight, {deadline}{adaptive}"

    @classmethod
    def of(cls, in_flight: int, slo_ms: float | None, interactive_share: float = 0.0,
           adaptive_slo_ms: float | None = None) -> GatewayLimits:
        """`in_flight` requests at most, interactive ones included (`split`). `slo_ms`: the
        deadline; `adaptive_slo_ms`: the adaptive filter on, for this SLO."""
        bulk, high = split(in_flight, interactive_share)
        target = adaptive_target_ms(adaptive_slo_ms, in_flight) if adaptive_slo_ms else None
        return cls(bulk, high, slo_ms, adaptive=bool(adaptive_slo_ms), target_p95_ms=target)

    @classmethod
    def from_claim(cls, claim_rps: float, p95_ms: float, slo_ms: float | None, interactive_share: float = 0.0,
                   burst_sds: float = BURST_SDS, adaptive_slo_ms: float | None = None) -> GatewayLimits:
        """`of` the `in_flight_limit` at the claim's rate and the P95 measured there."""
        return cls.of(in_flight_limit(claim_rps, p95_ms, burst_sds), slo_ms, interactive_share, adaptive_slo_ms)


def split(in_flight: int, interactive_share: float) -> tuple[int, int]:
    """(bulk, interactive) thresholds that keep `in_flight` at most in flight in all: Envoy counts
    each priority on its own, so interactive's share (at least one) is taken from bulk's, never
    added to it. Both at least one. With no share, one limit for both classes."""
    if not interactive_share:
        return in_flight, in_flight
    high = max(1, math.ceil(in_flight * interactive_share))
    return max(1, in_flight - high), high


def limits_for(spec: Spec, models: list[str], triton_version: str) -> GatewayLimits:
    """The gateway's limits for the served `models`: the spec's `server.gateway.max_in_flight`, else
    the sum of what `tune` wrote for each (`admission.max_in_flight`); without a limit it is
    refused, naming both places to set one. The deadline is the spec's `timeout_ms`, else the
    tightest SLO where the Triton behind it survives cancelled requests (`support.cancels_safely`),
    else none: the limit alone bounds the wait."""
    g = spec.server.gateway
    served = [m for m in spec.models if m.name in models]  # a pipeline is its models' traffic
    tuned = [m.admission.max_in_flight for m in served]
    limit = g.max_in_flight or (sum(tuned) if tuned and all(tuned) else None)
    slos = [m.slo.p95_ms for m in served if m.slo.p95_ms]
    timeout = g.timeout_ms or (min(slos) if slos and cancels_safely(triton_version) else None)
    if limit is None:
        raise InputError([Problem(spec.shown, "server.gateway.max_in_flight", "the gateway has no limit: it is unset "
                                  "and not every served model has an admission.max_in_flight from `tritonkit tune`",
                                  "run `tritonkit tune` for each model (it writes one to tuned.yaml), or set "
                                  "server.gateway.max_in_flight")])
    return GatewayLimits.of(limit, timeout, g.interactive_share, min(slos) if g.adaptive and slos else None)


@dataclass(frozen=True)
class Upstream:
    """Triton's ports behind the gateway (in a pod: on the loopback only)."""

    grpc_port: int
    http_port: int | None = None  # HTTP/1.1 clients (Locust, curl) are proxied here; None: gRPC only
    metrics_port: int | None = None  # served on the probe listener, for Prometheus
    address: str = "127.0.0.1"


# Model control, statistics, metadata and config: a load takes seconds, so they have no deadline,
# and they ride the HIGH threshold so a bulk flood cannot lock the tuner (or a load test, which
# reads a model's metadata before its first request and Triton's own figures around it) out of the
# server it measures.
CONTROL_PREFIXES = ("/inference.GRPCInferenceService/Repository", "/inference.GRPCInferenceService/ModelStatistics",
                    "/inference.GRPCInferenceService/ModelMetadata", "/inference.GRPCInferenceService/ModelConfig",
                    "/v2/repository")
# HTTP: a model's metadata, its config and statistics, per model or of all (a full match: never /infer)
CONTROL_REGEX = r"/v2/models(/[^/]+(/versions/[^/]+)?)?(/stats|/config)?"
# What the probe listener forwards to Triton's HTTP and metrics ports; anything else there is a 404.
PROBE_PATHS = ("/v2/health/ready", "/v2/health/live")


def _min_rtt(adaptive, envoy_type, target_p95_ms: float | None):
    """The gradient's reference: with a target, a fixed minimum RTT that puts minRTT + buffer on it
    (no sampling window, during which Envoy would admit one request at a time), in whole ms as
    Envoy keeps it, rounded down; else sampled at one in flight every 30 s. One in flight is also
    the floor of the limit it computes (Envoy's default floor is 3)."""
    buffer = envoy_type.Percent(value=RTT_BUFFER)
    if target_p95_ms:
        fixed = timedelta(milliseconds=max(1, math.floor(target_p95_ms / (1 + RTT_BUFFER / 100))))
        return adaptive.GradientControllerConfigMinimumRttCalculationParams(fixed_value=fixed, buffer=buffer,
                                                                            min_concurrency=1)
    return adaptive.GradientControllerConfigMinimumRttCalculationParams(
        interval=timedelta(seconds=30), request_count=50, min_concurrency=1, buffer=buffer)


def bootstrap(listen_port: int, upstream: Upstream | int, admin_port: int, limits: GatewayLimits,
              listen_address: str = "127.0.0.1", probe_port: int | None = None) -> dict:
    """The whole static bootstrap, as the JSON Envoy reads (`envoy -c`).

    One listener takes gRPC and HTTP/1.1 alike: a request whose content-type is gRPC goes to
    Triton's gRPC port over HTTP/2, any other to its HTTP port; each upstream has the same circuit
    breaker. With `probe_port`, a second listener serves only Triton's health endpoints and
    metrics, outside admission: a kubelet probe refused under overload would take the pod out of
    service exactly when it is busiest."""
    # Imported here: the gateway is optional, and envoy-data-plane's import is not small.
    import envoy_data_plane.envoy.config.bootstrap.v3 as boot
    import envoy_data_plane.envoy.config.cluster.v3 as cluster
    import envoy_data_plane.envoy.config.core.v3 as core
    import envoy_data_plane.envoy.config.endpoint.v3 as endpoint
    import envoy_data_plane.envoy.config.listener.v3 as listener
    import envoy_data_plane.envoy.config.route.v3 as route
    import envoy_data_plane.envoy.extensions.filters.http.adaptive_concurrency.v3 as adaptive
    import envoy_data_plane.envoy.extensions.filters.http.router.v3 as router
    import envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 as hcm
    import envoy_data_plane.envoy.extensions.upstreams.http.v3 as upstream_http
    import envoy_data_plane.envoy.type.matcher.v3 as matcher
    import envoy_data_plane.envoy.type.v3 as envoy_type
    from envoy_data_plane.google.protobuf import Any

    up = upstream if isinstance(upstream, Upstream) else Upstream(grpc_port=upstream)

    def address(host: str, port: int):
        return core.Address(socket_address=core.SocketAddress(address=host, port_value=port))

    def header(name: str, **match):
        return route.HeaderMatcher(name=name, string_match=matcher.StringMatcher(**match))

    grpc = header("content-type", prefix="application/grpc")
    interactive = header(CLASS_HEADER, exact="interactive")
    deadline = timedelta(milliseconds=limits.timeout_ms or 0)  # 0: none (Envoy's default is 15 s)
    protocols = [(UPSTREAM, [grpc])] + ([(UPSTREAM_HTTP, [])] if up.http_port else [])
    # The adaptive filter bounds bulk traffic alone: HIGH routes skip it (their own threshold bounds
    # them), so a flood it refuses never refuses interactive requests or model control, and their
    # load still lowers the limit it leaves the bulk.
    skip_adaptive = {ADAPTIVE_FILTER: Any.pack(route.FilterConfig(disabled=True))} if limits.adaptive else {}
    routes = []
    for name, by_protocol in protocols:  # gRPC first: the HTTP routes match whatever is left
        control = route.RouteAction(cluster=name, timeout=timedelta(0), priority=core.RoutingPriority.HIGH)
        for prefix in CONTROL_PREFIXES:
            routes.append(route.Route(match=route.RouteMatch(prefix=prefix, headers=by_protocol), route=control,
                                      typed_per_filter_config=skip_adaptive))
        routes.append(route.Route(match=route.RouteMatch(safe_regex=matcher.RegexMatcher(regex=CONTROL_REGEX),
                                                         headers=by_protocol), route=control,
                                  typed_per_filter_config=skip_adaptive))
        routes.append(route.Route(match=route.RouteMatch(prefix="/", headers=by_protocol + [interactive]),
                                  route=route.RouteAction(cluster=name, timeout=deadline,
                                                          priority=core.RoutingPriority.HIGH),
                                  typed_per_filter_config=skip_adaptive))
        routes.append(route.Route(match=route.RouteMatch(prefix="/", headers=by_protocol), route=route.RouteAction(
            cluster=name, timeout=deadline, priority=core.RoutingPriority.DEFAULT)))
    filters = []
    if limits.adaptive:
        gradient = adaptive.GradientControllerConfig(
            sample_aggregate_percentile=envoy_type.Percent(value=95.0),
            concurrency_limit_params=adaptive.GradientControllerConfigConcurrencyLimitCalculationParams(
                max_concurrency_limit=max(limits.max_requests, limits.max_requests_high),
                concurrency_update_interval=timedelta(milliseconds=100)),
            min_rtt_calc_params=_min_rtt(adaptive, envoy_type, limits.target_p95_ms))
        filters.append(hcm.HttpFilter(name=ADAPTIVE_FILTER, typed_config=Any.pack(
            adaptive.AdaptiveConcurrency(gradient_controller_config=gradient))))
    router_filter = hcm.HttpFilter(name="envoy.filters.http.router", typed_config=Any.pack(router.Router()))

    def http_listener(name: str, port: int, virtual_host, http_filters):
        manager = hcm.HttpConnectionManager(
            stat_prefix=name, codec_type=hcm.HttpConnectionManagerCodecType.AUTO,
            route_config=route.RouteConfiguration(name=name, virtual_hosts=[virtual_host]), http_filters=http_filters)
        return listener.Listener(name=name, address=address(listen_address, port), filter_chains=[
            listener.FilterChain(filters=[listener.Filter(name="envoy.filters.network.http_connection_manager",
                                                          typed_config=Any.pack(manager))])])

    listeners = [http_listener("ingress", listen_port, route.VirtualHost(name="triton", domains=["*"], routes=routes),
                               filters + [router_filter])]
    thresholds = [
        cluster.CircuitBreakersThresholds(priority=core.RoutingPriority.DEFAULT, max_requests=limits.max_requests,
                                          max_pending_requests=limits.max_requests, max_retries=0),
        cluster.CircuitBreakersThresholds(priority=core.RoutingPriority.HIGH, max_requests=limits.max_requests_high,
                                          max_pending_requests=limits.max_requests_high, max_retries=0),
    ]

    def triton_cluster(name: str, port: int, http2: bool, breakers=None):
        options = {}
        if http2:
            explicit = upstream_http.HttpProtocolOptionsExplicitHttpConfig(
                http2_protocol_options=core.Http2ProtocolOptions())
            h2 = upstream_http.HttpProtocolOptions(explicit_http_config=explicit)
            options = {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": Any.pack(h2)}
        return cluster.Cluster(
            name=name, type=cluster.ClusterDiscoveryType.STATIC, connect_timeout=timedelta(seconds=1),
            circuit_breakers=breakers, typed_extension_protocol_options=options,
            load_assignment=endpoint.ClusterLoadAssignment(cluster_name=name, endpoints=[endpoint.LocalityLbEndpoints(
                lb_endpoints=[endpoint.LbEndpoint(endpoint=endpoint.Endpoint(address=address(up.address, port)))])]))

    breakers = cluster.CircuitBreakers(thresholds=thresholds)
    clusters = [triton_cluster(UPSTREAM, up.grpc_port, True, breakers)]
    if up.http_port:
        clusters.append(triton_cluster(UPSTREAM_HTTP, up.http_port, False, breakers))
    if probe_port:
        probe_routes = [route.Route(match=route.RouteMatch(path=p), route=route.RouteAction(
            cluster=UPSTREAM_PROBE, timeout=timedelta(seconds=5))) for p in PROBE_PATHS if up.http_port]
        if up.metrics_port:
            probe_routes.append(route.Route(match=route.RouteMatch(path="/metrics"), route=route.RouteAction(
                cluster=UPSTREAM_METRICS, timeout=timedelta(seconds=10))))
            clusters.append(triton_cluster(UPSTREAM_METRICS, up.metrics_port, False))
        if up.http_port:
            clusters.append(triton_cluster(UPSTREAM_PROBE, up.http_port, False))
        probe_routes.append(route.Route(match=route.RouteMatch(prefix="/"), direct_response=route.DirectResponseAction(
            status=404)))
        listeners.append(http_listener("probes", probe_port, route.VirtualHost(name="probes", domains=["*"],
                                                                               routes=probe_routes), [router_filter]))
    config = boot.Bootstrap(
        admin=boot.Admin(address=address("127.0.0.1", admin_port)),  # never outside the pod: it can stop Envoy
        stats_flush_interval=timedelta(seconds=1),  # the admin's counters lag by at most this
        static_resources=boot.BootstrapStaticResources(listeners=listeners, clusters=clusters))
    return config.to_dict()


def write(path: Path, config: dict) -> bool:
    """The bootstrap as JSON, atomically (Envoy reads it once, at start)."""
    return write_bytes_atomic(Path(path), (json.dumps(config, indent=1, sort_keys=True) + "\n").encode())
