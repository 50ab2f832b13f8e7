"""`tritonkit validate` and `tritonkit configs`."""

from __future__ import annotations

import argparse
from pathlib import Path

from tritonkit.commandline import DEFAULT_REPO, say, spec_arg
from tritonkit.configs.generate import generate
from tritonkit.configs.loader import load_spec
from tritonkit.configs.server_fit import server_warnings
from tritonkit.spec import Spec
from tritonkit.support import spec_target


def warn(spec: Spec, target: str = "local") -> None:
    """What the target server would do with these configs that the rules cannot forbid."""
    for line in server_warnings(spec, target):
        say(f"warning: {spec.shown}: {line}")


def cmd_validate(a: argparse.Namespace) -> int:
    spec = load_spec(a.spec, a.repo)
    say(f"{a.spec}: ok ({len(spec.models)} model(s): {', '.join(m.name for m in spec.models)})")
    warn(spec)
    return 0


def cmd_configs(a: argparse.Namespace) -> int:
    spec = load_spec(a.spec, a.out)
    if a.target == "ngc":
        say(f"target: {spec_target(spec).describe()} (deploy.yaml's deploy block; this machine does not decide)")
    for r in generate(spec, a.out, a.target, a.model or None):
        state = "updated" if r.changed else "unchanged"
        say(f"{r.config_path}: {state} (runtime {r.runtime})")
    warn(spec, a.target)
    return 0


def register(sub) -> None:
    sp = sub.add_parser("validate", help="check deploy.yaml and the ONNX files it names")
    spec_arg(sp)
    sp.add_argument("--repo", type=Path, default=DEFAULT_REPO,
                    help="repository `tritonkit build` wrote: its prepared graphs are checked instead of the originals")
    sp.set_defaults(func=cmd_validate)

    sp = sub.add_parser("configs", help="generate config.pbtxt and version folders")
    spec_arg(sp)
    sp.add_argument("--out", type=Path, default=DEFAULT_REPO)
    sp.add_argument("--target", choices=["local", "ngc"], default="local",
                    help="server the repository is for: local (the tritonserver here, with the backends it has) or "
                         "ngc (the node the spec's deploy block names: its release, platform and GPU decide each "
                         "`runtime: auto` and instance kind; docs/support.md)")
    sp.add_argument("--model", action="append", help="only this model (repeatable)")
    sp.set_defaults(func=cmd_configs)
