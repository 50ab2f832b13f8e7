"""The `tritonkit` command line. Each stage registers its own subcommands (its `commands.py`);
this module wires them and turns errors into one line per problem and an exit code
(2: fix your input; 1: something failed)."""

from __future__ import annotations

import argparse
import sys

from tritonkit import commands as core
from tritonkit import interrupt
from tritonkit.benchmarks import commands as benchmarks
from tritonkit.build_engines import commands as build_engines
from tritonkit.clients import commands as clients
from tritonkit.configs import commands as configs
from tritonkit.errors import InputError, KitError
from tritonkit.helm import commands as helm
from tritonkit.loadtests import commands as loadtests
from tritonkit.tuner import commands as tuner

# In the order `tritonkit --help` lists them: from the spec to the cluster.
STAGES = (configs.register, build_engines.register, core.register, clients.register, loadtests.register,
          tuner.register, benchmarks.register, core.register_demo, helm.register)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tritonkit", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    for register in STAGES:
        register(sub)
    return p


def _quiet_half_built_clients(unraisable) -> None:
    """tritonclient's client raises from its destructor when an interrupt stopped its constructor
    half-way (it closes a stream it never made): nothing a user can act on, so it is not printed."""
    if isinstance(unraisable.exc_value, AttributeError) and "InferenceServerClient" in repr(unraisable.object):
        return
    sys.__unraisablehook__(unraisable)


def main(argv: list[str] | None = None) -> int:
    sys.unraisablehook = _quiet_half_built_clients
    interrupt.install()
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except InputError as e:
        for problem in e.problems:
            print(f"tritonkit: error: {problem}", file=sys.stderr)
        return e.exit_code
    except KitError as e:
        print(f"tritonkit: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("tritonkit: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
