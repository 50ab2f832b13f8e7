"""Steps that end in a written repository, for the commands that need them.

- build, then write the configs of what was built (`build`, `deploy`): `build_engines` returns its
  results and never calls back into `configs`;
- write the configs, then serve them with a local tritonserver (`serve`, `loadtest`, `sweep`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from tritonkit.build_engines.build import DEFAULT_CACHE, ModelResult, build
from tritonkit.configs.generate import WriteReport, generate
from tritonkit.configs.loader import resolve
from tritonkit.serving import Running, running
from tritonkit.spec import Spec


def build_then_configs(spec: Spec, out: Path, models: list[str] | None = None, target: str = "local",
                       cache_dir: Path = DEFAULT_CACHE, force: bool = False,
                       log: Callable[[str], None] = print) -> tuple[list[ModelResult], list[WriteReport]]:
    """`spec` is parsed and checked without its ONNX graphs (configs.loader, check_onnx=False): a
    batch-1 export is fine until `build` made it dynamic; the graphs are checked after the build."""
    results = build(spec, out, models, cache_dir, force=force, log=log)
    served = resolve(spec, out)  # the graphs just prepared swapped in, every rule checked on them
    reports = generate(served, out, target, [r.name for r in results])
    for r, rep in zip(results, reports):
        r.runtime = rep.runtime
    return results, reports


def serve_configured(spec: Spec, repo: Path, state_dir: Path, *, models: list[str] | None = None,
                     ports: dict[str, int] | None = None,
                     log: Callable[[str], None] = print) -> contextlib.AbstractContextManager[Running]:
    """Write the resolved spec's configs into `repo`, then a context that serves them."""
    if models:
        for name in models:
            spec.model(name)  # an unknown model is an InputError listing the known ones
    generate(spec, repo)
    return running(spec, repo, state_dir, models=models, ports=ports, log=log)
