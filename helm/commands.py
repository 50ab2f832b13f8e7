"""`tritonkit deploy`."""

from __future__ import annotations

import argparse
from pathlib import Path

from tritonkit.commandline import DEFAULT_REPO, say, spec_arg
from tritonkit.configs.loader import load_spec
from tritonkit.helm.deploy import deploy, deploy_problems


def cmd_deploy(a: argparse.Namespace) -> int:
    if a.dry_run and a.out is None:
        a.out = Path("out/deploy")
    # Every rule that needs no ONNX graph, the deploy block's too, before engines or configs are
    # written; the graphs are checked after the build, against what it prepared.
    spec = load_spec(a.spec, check_onnx=False, more=deploy_problems)
    r = deploy(spec, a.repo, dry_run=a.dry_run, out=a.out, chart=a.chart, kubeconfig=a.kubeconfig,
               kube_context=a.kube_context, wait=a.wait, timeout_s=a.timeout, log=say)
    if r.notes:
        say("\n" + r.notes)
    return 0


def register(sub) -> None:
    sp = sub.add_parser("deploy", help="build engines (GPU), generate configs, helm upgrade --install the chart "
                                       "into the current kube context (values from deploy.yaml's deploy block)")
    spec_arg(sp)
    sp.add_argument("--repo", type=Path, default=DEFAULT_REPO)
    sp.add_argument("--dry-run", action="store_true", help="render and check only; no cluster needed")
    sp.add_argument("--out", type=Path, help="write the rendered manifests here (default with --dry-run: out/deploy)")
    sp.add_argument("--chart", type=Path, help="chart folder (default: helm/triton-edge of the kit)")
    sp.add_argument("--kubeconfig", type=Path, help="default: $KUBECONFIG, then ~/.kube/config")
    sp.add_argument("--kube-context", help="default: the kubeconfig's current context")
    sp.add_argument("--wait", action="store_true", help="wait until the pods are ready")
    sp.add_argument("--timeout", type=int, default=600, help="seconds for helm (and --wait)")
    sp.set_defaults(func=cmd_deploy)
