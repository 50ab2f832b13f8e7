"""`--lengths NAME=DIST:...`: a length distribution for one input, given on the command line for
one run (`loadtest`, `sweep`, `tune`) in place of the spec's `lengths`.

    --lengths line=uniform:32:320
    --lengths input_ids=loguniform:8:512
    --lengths input_ids=histogram:16=5,64=3,256=1

It becomes the input's `lengths` in the command's spec, checked by the same rules as the spec's
own (`configs/rules.py`, `length_rules`), so everything that draws from the spec (the sampler behind
every generator, perf_analyzer's payloads, the sweep and the tuner's trials) draws from it. A
problem is reported against the flag, not deploy.yaml, since that is where the value came from.
"""

from __future__ import annotations

from pydantic import ValidationError

from tritonkit.configs.rules import spec_problems
from tritonkit.errors import InputError, Problem
from tritonkit.spec import Lengths, Spec

FLAG = "--lengths"
FORMS = "NAME=uniform:LOW:HIGH, NAME=loguniform:LOW:HIGH or NAME=histogram:LEN=WEIGHT,LEN=WEIGHT"


def _problem(value: str, message: str, fix: str = f"write it as {FORMS}") -> Problem:
    return Problem("command line", f"{FLAG} {value}", message, fix)


def parse(value: str) -> tuple[str, Lengths]:
    """`NAME=DIST:...` as the input's name and its distribution; InputError naming the flag."""
    name, eq, dist = value.partition("=")
    kind, _, rest = dist.partition(":")
    try:
        if not (name and eq and rest):
            raise ValueError("not NAME=DIST:...")
        if kind == "histogram":
            pairs = [p.split("=") for p in rest.split(",")]
            if any(len(p) != 2 or not p[0].isdigit() for p in pairs):
                raise ValueError("each entry is LEN=WEIGHT, LEN a whole number")
            lengths = Lengths(dist="histogram", histogram={int(n): float(w) for n, w in pairs})
        else:
            bounds = rest.split(":")
            if len(bounds) != 2 or not all(b.isdigit() for b in bounds):
                raise ValueError(f"{kind} takes LOW:HIGH, two whole numbers")
            lengths = Lengths(dist=kind, low=int(bounds[0]), high=int(bounds[1]))
    except (ValueError, ValidationError) as e:
        why = e.errors()[0]["msg"] if isinstance(e, ValidationError) else str(e)
        raise InputError([_problem(value, f"cannot read it ({why})")]) from None
    return name, lengths


def with_lengths(spec: Spec, model: str, values: list[str] | None) -> Spec:
    """`spec` with each `--lengths` value as its input's `lengths`, their rules checked here (the
    variant is checked whole again when `configs.generate` writes it)."""
    if not values:
        return spec
    m = spec.model(model)
    inputs = list(m.inputs or [])
    for value in values:
        name, lengths = parse(value)
        at = next((j for j, t in enumerate(inputs) if t.name == name), None)
        if at is None:
            declared = ", ".join(t.name for t in inputs) or "none"
            raise InputError([_problem(value, f"{model} declares no input {name!r} in the spec (declared: {declared})",
                                       "declare the input under inputs with its min and max, or name a declared one")])
        inputs[at] = inputs[at].model_copy(update={"lengths": lengths})
    variant = spec.with_model(m.model_copy(update={"inputs": inputs}))
    problems = [p for p in spec_problems(variant, check_onnx=False) if ".lengths" in p.path]
    if problems:
        raise InputError([_problem(", ".join(values), p.message, p.fix) for p in problems])
    return variant
