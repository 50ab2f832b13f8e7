"""`tritonkit build` and `tritonkit inspect`."""

from __future__ import annotations

import argparse
from pathlib import Path

from tritonkit.build_engines.build import raise_failures, table
from tritonkit.build_engines.inspect_graph import inspect_paths
from tritonkit.commandline import DEFAULT_REPO, DEFAULT_STATE, say, spec_arg
from tritonkit.configs.loader import load_spec
from tritonkit.configs.steps import build_then_configs
from tritonkit.spec import parse_spec


def cmd_build(a: argparse.Namespace) -> int:
    # The original graphs are prepared: nothing swapped in, and they are checked after the build.
    spec = load_spec(a.spec, check_onnx=False)
    results, _ = build_then_configs(spec, a.out, a.model or None, a.target, a.cache_dir, force=a.force, log=say)
    say(table(results))
    raise_failures(results)  # after the table: each failed model named, with its field and fix
    return 0


def cmd_inspect(a: argparse.Namespace) -> int:
    # Only the structure: inspecting is how one finds out why a graph breaks a rule.
    spec = None if a.onnx else parse_spec(a.spec)
    say(inspect_paths(a.onnx, spec, a.model or None))
    return 0


def register(sub) -> None:
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
