"""A spec's models served by a local tritonserver: start it with its models loaded, stop it.

Used by `tritonkit serve`, the demo and the tests, so that all three start Triton the same way. The
models (and pipelines, after their models) are loaded by Triton itself as it starts (`--load-model`),
so the server reports ready only once every one of them can answer; `Running.load` reloads one later.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tritonkit.clients import Client, TritonRequestError
from tritonkit.errors import ServerError
from tritonkit.server import Endpoints, LocalTriton
from tritonkit.spec import Spec


@dataclass
class Running:
    server: LocalTriton
    endpoints: Endpoints
    served: tuple[str, ...] = ()  # the models and pipelines loaded at start, a pipeline after its models

    def client(self, protocol: str = "grpc") -> Client:
        url = self.endpoints.grpc if protocol == "grpc" else self.endpoints.http
        return Client(url, protocol, self.endpoints.key_headers)

    def load(self, model: str, log: Callable[[str], None] = lambda s: None) -> float:
        """Load (or reload) a model from the repository; returns seconds taken."""
        t0 = time.perf_counter()
        with self.client() as c:
            try:
                c.load(model)
            except TritonRequestError as e:
                if not self.server.alive():
                    raise ServerError(f"tritonserver stopped while loading {model!r}: "
                                      f"{self.server.failure_reason()}") from None
                raise ServerError(f"model {model!r} failed to load: {e} "
                                  f"(server log: {self.server.log_path})") from None
        took = time.perf_counter() - t0
        log(f"  loaded {model} in {took:.1f} s")
        return took


@contextlib.contextmanager
def running(spec: Spec, repository: Path, state_dir: Path, *, models: list[str] | None = None,
            ports: dict[str, int] | None = None, log: Callable[[str], None] = lambda s: None,
            cpus: set[int] | None = None) -> Iterator[Running]:
    names = spec.with_steps(models if models is not None else spec.served())  # a pipeline after its models
    use_cache = any(m.response_cache for m in spec.models if m.name in names)
    server = LocalTriton(repository, spec.server, state_dir, use_cache=use_cache, cpus=cpus, models=names,
                         **(ports or {}))
    log(f"starting tritonserver with {len(names)} model(s) ...")
    t0 = time.perf_counter()
    with server:
        took = server.load_times()
        for name in names:
            t = took.get(name)
            log(f"  loaded {name}" + (f" in {t:.1f} s" if t is not None else ""))
        log(f"  ready (pid {server.proc.pid}) in {time.perf_counter() - t0:.1f} s")
        yield Running(server, server.endpoints, tuple(names))
    log("tritonserver stopped")
