"""`tritonkit deploy`."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from tritonkit.commandline import DEFAULT_REPO, say, spec_arg
from tritonkit.configs.loader import load_spec
from tritonkit.errors import InputError, KitError, flag_problem
from tritonkit.helm import chart as helm_chart
from tritonkit.helm import tune_job
from tritonkit.helm.deploy import DeployResult, deploy, deploy_problems
from tritonkit.spec import TUNED_FILE, Spec


def cmd_deploy(a: argparse.Namespace) -> int:
    if a.apply and not a.tune:
        raise InputError([flag_problem("--apply", "add --tune: --apply deploys what the tune Job found "
                                                  "(tritonkit deploy --tune --apply)")])
    if a.tune and not a.dry_run:
        tune_job.kubectl_binary()  # no kubectl: say so before minutes of engine builds
    if a.dry_run and a.out is None:
        a.out = Path("out/deploy")
    # Every rule that needs no ONNX graph, the deploy block's too, before engines or configs are
    # written; the graphs are checked after the build, against what it prepared.
    spec = load_spec(a.spec, check_onnx=False, more=deploy_problems)
    r = _deploy(a, spec, tune=True if a.tune else None)
    if not a.tune:
        _notes(r)
        return 0
    if a.dry_run:
        _show_plan(a, spec, tune_job.plan(r.rendered))
        _notes(r)
        return 0
    return _tune(a, spec, r)


def _deploy(a: argparse.Namespace, spec: Spec, tune: bool | None) -> DeployResult:
    return deploy(spec, a.repo, dry_run=a.dry_run, out=a.out, chart=a.chart, kubeconfig=a.kubeconfig,
                  kube_context=a.kube_context, wait=a.wait, timeout_s=a.timeout, log=say, tune=tune,
                  preflight_cluster=not a.no_preflight, kubectl=a.kubectl)


def _notes(r: DeployResult) -> None:
    if r.notes:
        say("\n" + r.notes)


def _show_plan(a: argparse.Namespace, spec: Spec, p: tune_job.JobPlan) -> None:
    say(f"tune: would run job/{p.name} in namespace {p.namespace} (the name ends with the release revision, "
        "1 on a first install)")
    say(f"tune: on the Triton pod's node, at most {p.deadline_s} s, one model after another:")
    for cmd in p.commands:
        say("  " + shlex.join(cmd))
    say(f"tune: would wait for it (kubectl wait --for=condition=complete job/{p.name}), read its log "
        f"(kubectl logs job/{p.name} -c {tune_job.CONTAINER})")
    say(f"tune: and write {spec.path.parent / TUNED_FILE}; "
        + ("--apply would then upgrade the release with the tuned configs and tune.enabled false" if a.apply
           else "add --apply to deploy the tuned configs once it is done"))


def _tune(a: argparse.Namespace, spec: Spec, r: DeployResult) -> int:
    p = tune_job.plan(r.rendered)
    if r.revision < 1:
        raise KitError("tune: Helm did not say which release revision it installed, so the tune Job's name is "
                       f"unknown (fix: kubectl -n {p.namespace} get jobs, then kubectl logs job/<name> -c tune)")
    job = tune_job.job_name(p.fullname, r.revision)
    kubectl = tune_job.Kubectl(tune_job.kubectl_binary(), p.namespace, helm_chart.kubeconfig_path(a.kubeconfig),
                               a.kube_context)
    outcome = tune_job.run_job(spec, kubectl, job, p.wait_s(), log=say)
    failed = outcome.log.failed
    if not a.apply:
        _notes(r)
        say(f"\ntune: deploy the tuned configs with `tritonkit deploy --spec {a.spec}` (it reads {TUNED_FILE})")
        return 1 if failed else 0
    # The configs again from deploy.yaml with the tuned.yaml just written, as a plain deploy makes
    # them, and the release upgraded with them and without the Job.
    tuned_spec = load_spec(a.spec, check_onnx=False, more=deploy_problems)
    applied = _deploy(a, tuned_spec, tune=False)
    _notes(applied)
    say(f"\ntune: applied {', '.join(outcome.log.tuned)} (release revision {applied.revision})")
    if failed:
        raise KitError(f"tune: {', '.join(failed)} not tuned (their configs are unchanged); see the log of "
                       f"job/{job} while it is kept")
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
    sp.add_argument("--tune", action="store_true",
                    help="also run the chart's tune Job (`tritonkit tune --url` on the Triton pod's node), wait for "
                         "it with kubectl and write its tuned.yaml beside the spec")
    sp.add_argument("--no-preflight", action="store_true",
                    help="install without first checking the cluster (RuntimeClass, GPUs, architectures)")
    sp.add_argument("--kubectl", help="the kubectl preflight runs (default: kubectl on PATH)")
    sp.add_argument("--apply", action="store_true",
                    help="with --tune: then upgrade the release with the tuned configs (and the Job off)")
    sp.set_defaults(func=cmd_deploy)
