"""Steps that end in a written repository, for the commands that need them.

- build, then write the configs of what was built (`build`, `deploy`): `build_engines` returns its
  results and never calls back into `configs`;
- write the configs, then serve them with a local tritonserver (`serve`, `loadtest`, `sweep`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tritonkit.build_engines.build import DEFAULT_CACHE, ModelResult, build
from tritonkit.configs.gateway import GatewayLimits, Upstream, bootstrap, limits_for
from tritonkit.configs.gateway import write as write_gateway
from tritonkit.configs.generate import WriteReport, generate
from tritonkit.configs.loader import resolve
from tritonkit.errors import InputError, Problem
from tritonkit.gateway import LocalEnvoy
from tritonkit.server import free_port
from tritonkit.serving import Running, running
from tritonkit.spec import Spec
from tritonkit.support import Target, local_triton, spec_target


def build_then_configs(spec: Spec, out: Path, models: list[str] | None = None, target: str | Target = "local",
                       cache_dir: Path = DEFAULT_CACHE, force: bool = False,
                       log: Callable[[str], None] = print,
                       partial: bool = True) -> tuple[list[ModelResult], list[WriteReport]]:
    """`spec` is parsed and checked without its ONNX graphs (configs.loader, check_onnx=False): a
    batch-1 export is fine until `build` made it dynamic; the graphs are checked after the build.
    Configs are written for the models that built (none at all if one failed and not `partial`);
    the failed ones are in the results, for the caller to report (`build_engines.build.raise_failures`)."""
    if target == "ngc":
        target = spec_target(spec)  # the node the deploy block names
    # A deploy target's engines are built on its node: here the models are prepared and planned only.
    results = build(spec, out, models, cache_dir, force=force, log=log, engines=not isinstance(target, Target))
    built = [r.name for r in results if not r.failed]
    if not built or (not partial and len(built) < len(results)):
        return results, []
    served = _resolve_built(spec, out, {r.name for r in results if r.failed})
    reports = generate(served, out, target, built)
    runtimes = {rep.model: rep.runtime for rep in reports}
    for r in results:
        r.runtime = runtimes.get(r.name, r.runtime)
    return results, reports


def _resolve_built(spec: Spec, out: Path, failed: set[str]) -> Spec:
    """The spec with the graphs just prepared swapped in, every rule checked on them, except the
    problems of the models that failed to build: build reports those, and none of them is written."""
    if not failed:
        return resolve(spec, out)
    skipped = [f"models[{i}]" for i, m in enumerate(spec.models) if m.name in failed]

    def theirs(p: Problem) -> bool:
        return any(p.path == at or p.path.startswith(f"{at}.") for at in skipped)

    try:
        return resolve(spec, out)
    except InputError as e:
        left = [p for p in e.problems if not theirs(p)]
        if left:
            raise InputError(left) from None
    served = resolve(spec, out, check_onnx=False)
    served.checked = True  # every rule holds for the models written; the failed ones are not
    return served


def serve_configured(spec: Spec, repo: Path, state_dir: Path, *, models: list[str] | None = None,
                     ports: dict[str, int] | None = None,
                     log: Callable[[str], None] = print) -> contextlib.AbstractContextManager[Running]:
    """Write the resolved spec's configs into `repo`, then a context that serves them."""
    if models:
        for name in models:
            spec.steps_of(name)  # an unknown name is an InputError listing the models and pipelines
    generate(spec, repo)
    return running(spec, repo, state_dir, models=models, ports=ports, log=log)


@dataclass
class Gateway:
    url: str  # HOST:PORT clients connect to, gRPC and HTTP alike
    limits: GatewayLimits
    envoy: LocalEnvoy


@contextlib.contextmanager
def gateway_in_front(spec: Spec, r: Running, state_dir: Path,
                     limits: GatewayLimits | None = None) -> Iterator[Gateway | None]:
    """Envoy in front of `r`'s gRPC port where the spec asks (`server.gateway.enabled`), for as long
    as the context lasts; None where it does not. `limits`: checked before the server started
    (`configs.gateway.limits_for`), else here."""
    g = spec.server.gateway
    if not g.enabled:
        yield None
        return
    limits = limits or limits_for(spec, list(r.served), local_triton())
    port, admin = g.port or free_port(spec.server.host), g.admin_port or free_port()
    config = Path(state_dir) / "envoy.json"
    e = r.endpoints
    upstream = Upstream(grpc_port=e.grpc_port, http_port=e.http_port, address=e.host)
    write_gateway(config, bootstrap(port, upstream, admin, limits, listen_address=spec.server.host))
    with LocalEnvoy(config, admin, Path(state_dir) / "envoy.log") as envoy:
        yield Gateway(f"{spec.server.host}:{port}", limits, envoy)
