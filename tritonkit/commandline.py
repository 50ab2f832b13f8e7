"""What every stage's `commands.py` shares: default paths, the --spec flag, printing.

Each stage registers its own subcommands (`register(subparsers)`); `tritonkit.cli` wires them
and turns errors into exit codes. A command parses the spec once, through `configs.loader`, and
hands the resolved Spec to its stage (ARCHITECTURE.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_SPEC = Path("deploy.yaml")
DEFAULT_REPO = Path("model_repository")
DEFAULT_STATE = Path(".tritonkit")


def say(msg: str) -> None:
    print(msg, flush=True)


def spec_arg(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--spec", type=Path, default=DEFAULT_SPEC, help="deploy.yaml (default: %(default)s)")


def port_overrides(a: argparse.Namespace) -> dict[str, int]:
    return {k: v for k in ("http_port", "grpc_port", "metrics_port") if (v := getattr(a, k)) is not None}
