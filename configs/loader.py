"""The one spec loader. Commands call it once, at their boundary; every stage takes what it returns.

    load_spec(path, repo)  =  check(prepared(parse(path), repo))

- parse: deploy.yaml read and type-checked, tuned.yaml overlaid (`tritonkit.spec.parse_spec`);
- prepared: each model that `tritonkit build` prepared in `repo` points at the prepared graph, so a
  batch-1 export that `build` made dynamic is served, measured and tuned as built
  (`build_engines.artifacts.prepared_spec`);
- check: every cross-field rule and Triton load-time rule, and the tensors against the ONNX graph
  (`configs.rules`). The spec is marked checked; a variant derived from it is checked again
  when `configs.generate` writes it.

Each step is a small function over a Spec, so a command that needs a different composition says
so in one line: `build` parses without swapping in (it prepares from the original) and checks the
graphs after it built them (`resolve`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tritonkit.build_engines.artifacts import prepared_spec
from tritonkit.configs.rules import spec_problems
from tritonkit.errors import InputError, Problem
from tritonkit.spec import Spec, parse_spec

Rules = Callable[[Spec], list[Problem]]


def check(spec: Spec, check_onnx: bool = True, more: Rules | None = None) -> Spec:
    """Every rule (and a stage's own, `more`: deploy's), one InputError listing every problem.
    Returns the same object, marked checked when the ONNX graphs were checked too (what
    `configs` needs before it writes)."""
    problems = spec_problems(spec, check_onnx=check_onnx) + (more(spec) if more else [])
    if problems:
        raise InputError(problems)
    spec.checked = check_onnx
    return spec


def resolve(spec: Spec, repo: Path | None, check_onnx: bool = True, more: Rules | None = None) -> Spec:
    """A parsed spec as `repo` serves it: prepared graphs swapped in, then checked."""
    if repo is not None:
        spec = prepared_spec(spec, Path(repo))
    return check(spec, check_onnx, more)


def load_spec(path: Path, repo: Path | None = None, *, check_onnx: bool = True, more: Rules | None = None) -> Spec:
    """The resolved spec of a command: parsed once, prepared graphs of `repo` swapped in, checked."""
    return resolve(parse_spec(path), repo, check_onnx, more)
