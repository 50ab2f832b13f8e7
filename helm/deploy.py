"""`tritonkit deploy`: deploy.yaml to a Helm release on edge Kubernetes.

Build engines (where a GPU is), generate the NGC configs, package them into the chart's values (a
ConfigMap in the cluster), render and check the manifests, then `helm upgrade --install`. With
`dry_run` nothing touches a cluster: the manifests are written to a folder instead. With `tune`
the release also runs the chart's tune Job (helm/tune_job.py waits for it and reads it back).
"""

from __future__ import annotations

import copy
import importlib.resources
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tritonkit.build_engines.build import raise_failures, table
from tritonkit.build_engines.node_plan import node_plan, node_plan_problems
from tritonkit.configs.gateway import Upstream, bootstrap, limits_for
from tritonkit.configs.generate import generate
from tritonkit.configs.loader import resolve
from tritonkit.configs.steps import build_then_configs
from tritonkit.errors import InputError, KitError, Problem
from tritonkit.helm import bundle, preflight
from tritonkit.helm import chart as helm_chart
from tritonkit.helm.tune_job import tune_problems
from tritonkit.spec import TUNED_FILE, Spec, _apply_tuned
from tritonkit.support import Target, spec_problems, spec_target

BUNDLE_FILE = "models.tar.gz"
DEFAULT_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}  # the spec's 0 (a free port) means nothing in a pod


class PreflightFailed(KitError):
    """The cluster lacks what the release needs: nothing was installed (exit 2, the user's to fix)."""

    exit_code = 2

    def __init__(self, findings: list[str]):
        self.findings = findings
        super().__init__("preflight: nothing was installed:\n" + "\n".join(f"  {f}" for f in findings))


@dataclass
class DeployResult:
    values: dict
    rendered: helm_chart.Rendered
    written: list[Path] = field(default_factory=list)
    notes: str = ""
    revision: int = 0  # the release revision installed (0: a dry run)


def build_engines(spec: Spec, repo: Path, target: Target, log: Callable[[str], None]) -> None:
    """Prepare, verify and plan every model here (`tritonkit build`, no engine: engines are built on
    the node, by the TensorRT that serves them), and write the configs for the target."""
    results, _ = build_then_configs(spec, repo, target=target, log=log, partial=False)
    log(table(results))
    raise_failures(results)  # a deploy goes out whole or not at all: no configs written, nothing installed


def locustfile_text() -> str:
    return (importlib.resources.files("tritonkit.loadtests") / "locustfile.py").read_text()


def _image(ref: str) -> dict:
    """registry/repo:tag or registry/repo@sha256:... into the chart's image block."""
    m = re.fullmatch(r"(?:(?P<reg>[^/]+\.[^/]+|localhost(?::\d+)?|[^/]+:\d+)/)?(?P<repo>[a-z0-9._/-]+)"
                     r"(?::(?P<tag>[\w.-]+))?(?:@(?P<digest>sha256:[a-f0-9]{64}))?", ref)
    if not m:
        return {}
    out = {"registry": m["reg"] or "", "repository": m["repo"]}
    if m["tag"]:
        out["tag"] = m["tag"]
    if m["digest"]:
        out["digest"] = m["digest"]
    return out


def _merge(base: dict, over: dict) -> dict:
    """Deep merge (maps merge, everything else is replaced), like Helm's values coalescing."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _spec_for_tuner(spec: Spec, tuned: bool = False) -> str:
    """The spec the tuner sidecar and the tune Job read: models and server only. The deploy block can
    carry anything (a fetch URL with credentials in deploy.values), so it never goes into a ConfigMap.
    With `tuned`, the local tuned.yaml is overlaid, so the tune Job starts from the configs the server
    serves (the tuned.yaml it writes beside its copy then holds only what it tuned)."""
    raw = copy.deepcopy(spec.source or {})  # deploy.yaml as written, read once by the command's parse
    raw.pop("deploy", None)
    if tuned:
        _apply_tuned(raw, spec.path.parent / TUNED_FILE)
    return yaml.safe_dump(raw, sort_keys=False)


def deploy_problems(spec: Spec) -> list[Problem]:
    """The deploy block's cross-field rules, checked before anything is built or written."""
    d = spec.data.deploy
    problems = spec_problems(spec)
    kit_image = _image(d.kit_image) if d.kit_image else {}
    if d.kit_image and not kit_image:
        problems.append(Problem(spec.shown, "deploy.kit_image", f"{d.kit_image!r} is not an image reference",
                                "use registry/repository:tag"))
    if d.locust.model and d.locust.model not in spec.served():
        problems.append(Problem(spec.shown, "deploy.locust.model", f"no model or pipeline named {d.locust.model!r}",
                                f"use one of: {', '.join(spec.served())}"))
    if d.engines.source == "fetch" and not d.engines.url:
        problems.append(Problem(spec.shown, "deploy.engines.url", "source fetch needs the archive's URL",
                                "set deploy.engines.url (an archive of <model>/1/ folders)"))
    if d.autoscaling.max_replicas < d.autoscaling.min_replicas:
        problems.append(Problem(spec.shown, "deploy.autoscaling.max_replicas", "is below min_replicas",
                                "raise it to at least min_replicas"))
    return problems


def chart_values(spec: Spec, repo: Path, tune: bool | None = None, bundle_sha: str | None = None) -> dict:
    """The chart values for this spec. Reads the generated config.pbtxt files from `repo`. `tune`
    switches the tune Job on or off whatever deploy.values says (None: as deploy.values says).
    `bundle_sha`: the digest of the archive deploy wrote, pinned where the spec pins none."""
    helm_chart.require_deploy_extra()  # before engines and configs are written
    problems = deploy_problems(spec)
    if problems:
        raise InputError(problems)
    d = spec.data.deploy
    s = spec.server
    names = [m.name for m in spec.models]
    served = spec.served()  # what the server loads: the models, then the pipelines (ensembles) over them
    kit_image = _image(d.kit_image) if d.kit_image else {}
    ports = {k: getattr(s, f"{k}_port") or v for k, v in DEFAULT_PORTS.items()}
    engines: dict = {"source": d.engines.source}
    if d.engines.source == "hostPath":
        # Default: the repository generated here, which is right on a single-node k3s/MicroK8s box.
        engines["hostPath"] = {"path": d.engines.host_path or str(Path(repo).resolve())}
    elif d.engines.source == "pvc":
        engines["pvc"] = {"existingClaim": d.engines.pvc or "", "size": d.engines.pvc_size}
    else:
        engines["fetch"] = {"url": d.engines.url or "", "sha256": (d.engines.sha256 or bundle_sha or "").lower()}
    slos = [m.slo.p95_ms for m in spec.models if m.slo.p95_ms]
    # Scale out before queueing eats the latency budget: a quarter of the tightest P95 SLO.
    queue_target = d.autoscaling.target_queue_us or (max(500, int(min(slos) * 1000 / 4)) if slos else 5000)

    target = spec_target(spec)
    values = {
        "platform": d.platform,
        "image": {"tag": d.triton_version, "flavor": target.flavor},
        "replicaCount": d.replicas,
        "models": served,
        "server": {
            "ports": ports,
            "gpuMetrics": d.gpus > 0,
            # Triton allocates the whole cache up front: only when a model uses it.
            "responseCache": {"enabled": any(m.response_cache for m in spec.models), "sizeMB": s.response_cache_mb},
        },
        "auth": {"header": s.restricted_key.header},
        "gpu": {"count": d.gpus},
        "runtimeClassName": d.runtime_class if d.runtime_class is not None else
        ("nvidia" if d.platform == "jetson" else ""),
        "nodeSelector": d.node_selector,
        "modelRepository": {"configs": {n: (Path(repo) / n / "config.pbtxt").read_text() for n in served}},
        "engines": {**engines, "build": engine_build(spec, repo, target, served)},
        "service": {"ports": {"http": ports["http"], "grpc": ports["grpc"]}},
        "metrics": {"service": {"port": ports["metrics"]}, "serviceMonitor": {"enabled": d.service_monitor}},
        "autoscaling": {
            "enabled": d.autoscaling.enabled,
            "minReplicas": d.autoscaling.min_replicas,
            "maxReplicas": d.autoscaling.max_replicas,
            "metric": "queueTime" if d.autoscaling.metric == "queue_time" else "cpu",
            "queueTime": {"targetAverageValue": str(queue_target)},
            "cpu": {"targetUtilization": d.autoscaling.target_cpu_percent},
        },
        "tuner": {"enabled": d.tuner, "models": names, "apiKeyEnv": s.restricted_key.value_env},
        "tune": {"models": names},
        "locust": {"enabled": d.locust.enabled, "workers": d.locust.workers, "model": d.locust.model or names[0]},
    }
    if s.gateway.enabled:
        values["gateway"] = gateway_values(spec, served, ports)
    if d.locust.enabled:
        values["locust"]["locustfile"] = locustfile_text()
    if kit_image:
        values["kit"] = {"image": kit_image}
    values = _merge(values, d.values)
    tune_values = values["tune"] if isinstance(values.get("tune"), dict) else {}  # else the schema refuses it
    if tune is not None:
        values["tune"] = tune_values = {**tune_values, "enabled": tune}
    tune_on = tune_values.get("enabled") is True
    if (d.tuner or tune_on) and not values["modelRepository"].get("spec"):
        values["modelRepository"]["spec"] = _spec_for_tuner(spec, tuned=tune_on)
    return values


GATEWAY_PORTS = {"traffic": 8010, "probes": 8011, "admin": 9901}  # the chart's defaults


def gateway_values(spec: Spec, served: list[str], ports: dict[str, int]) -> dict:
    """The Envoy sidecar: its bootstrap from the tuned limits (`configs.gateway.limits_for`, exit 2
    without one), listening on the pod's address, Triton behind it on the loopback."""
    g = spec.server.gateway
    gw_ports = {**GATEWAY_PORTS, **({"traffic": g.port} if g.port else {}),
                **({"admin": g.admin_port} if g.admin_port else {})}
    upstream = Upstream(grpc_port=ports["grpc"], http_port=ports["http"], metrics_port=ports["metrics"])
    config = bootstrap(gw_ports["traffic"], upstream, gw_ports["admin"],
                       limits_for(spec, served, spec_target(spec).release.triton),
                       listen_address="0.0.0.0", probe_port=gw_ports["probes"])
    return {"enabled": True, "ports": gw_ports, "bootstrap": json.dumps(config, sort_keys=True)}


def on_node(repo: Path, served: list[str]) -> list[str]:
    """The models whose config serves a TensorRT engine: the node builds those."""
    return [n for n in served if 'platform: "tensorrt_plan"' in (Path(repo) / n / "config.pbtxt").read_text()]


def engine_build(spec: Spec, repo: Path, target: Target, served: list[str]) -> dict:
    """The chart's engines.build: the plan made here, the image that builds on the node."""
    models = on_node(repo, served)
    if not models:
        return {"enabled": False}
    problems = node_plan_problems(spec, models)
    if problems:
        raise InputError(problems)
    registry, _, rest = target.build_image.partition("/")
    repository, _, tag = rest.partition(":")
    plan = node_plan(spec, Path(repo), models, target.release.tensorrt)
    return {"enabled": True, "models": models, "plan": json.dumps(plan, sort_keys=True),
            "image": {"registry": registry, "repository": repository, "tag": tag}}


def _rejected(spec: Spec, e: helm_chart.ValuesRejected) -> KitError:
    """Values Helm refuses come from deploy.yaml (deploy.values, mostly): say so, with the file."""
    return InputError([Problem(spec.shown, "deploy", f"the chart refused the values: {e}",
                               "check deploy.values against helm/triton-edge/README.md (Parameters)")])


def deploy(spec: Spec, repo: Path, *, dry_run: bool = False, out: Path | None = None,
           chart: Path | None = None, kubeconfig: Path | None = None, kube_context: str | None = None,
           wait: bool = False, timeout_s: int = 600, log: Callable[[str], None] = print,
           tune: bool | None = None, preflight_cluster: bool = True, kubectl: str | None = None) -> DeployResult:
    """`spec` is parsed and checked without its ONNX graphs (configs.loader, check_onnx=False):
    the graphs are checked after the build, against what it prepared. `tune`: the tune Job on
    (True) or off (False) in this release, whatever deploy.values says."""
    helm_chart.require_deploy_extra()  # before engines and configs are written
    problems = deploy_problems(spec) + (tune_problems(spec) if tune else [])
    if problems:
        raise InputError(problems)
    d = spec.data.deploy
    if chart is not None and not (Path(chart) / "Chart.yaml").is_file():
        raise InputError([Problem("command line", "--chart", f"{chart} is not a Helm chart (no Chart.yaml)",
                                  "pass the chart folder, e.g. helm/triton-edge")])
    config = None if dry_run else helm_chart.kubeconfig_path(kubeconfig)  # no cluster: said before any work

    target = spec_target(spec)
    log(f"target: {target.describe()}; images for {', '.join(target.image_arches)}")
    build_engines(spec, repo, target, log)
    served = resolve(spec, repo)
    for r in generate(served, repo, target=target):
        log(f"configs: {r.config_path} ({r.runtime}{', updated' if r.changed else ''})")
    bundle_sha = None
    if d.engines.source == "fetch" and not d.engines.sha256:
        path = (Path(out) if out is not None else Path(repo).parent) / BUNDLE_FILE
        bundle_sha = bundle.write(Path(repo), list(spec.served()), path)
        log(f"engines: wrote {path} (sha256 {bundle_sha}); the pods fetch it from deploy.engines.url")
        if d.engines.upload and not dry_run:
            bundle.upload(path, d.engines.url)
            log("engines: uploaded it to deploy.engines.url")
    values = chart_values(spec, repo, tune=tune, bundle_sha=bundle_sha)
    try:
        rendered = helm_chart.render(values, d.release, d.namespace, chart)
    except helm_chart.ValuesRejected as e:
        raise _rejected(spec, e) from None
    problems = helm_chart.validate(rendered)
    if problems:
        raise KitError(f"rendered manifests fail the Kubernetes schemas: {problems[0]}"
                       + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    problems = helm_chart.lint(values, chart)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise KitError(f"helm lint --strict: {problems[0]}{more}")
    versions = " and ".join(helm_chart.kube_versions())
    log(f"chart: {len(rendered.manifests)} manifests rendered by {rendered.engine}, lint clean (strict), "
        f"valid for Kubernetes {versions}")
    if d.engines.source == "hostPath":
        log(f"engines: hostPath {values['engines']['hostPath']['path']} must hold <model>/1/ on the node")
    result = DeployResult(values, rendered)
    if out is not None:
        result.written = helm_chart.write(rendered, values, out)
        log(f"wrote {len(result.written)} files to {out} (all manifests in {Path(out) / 'manifests.yaml'})")
    if dry_run:
        log("preflight: would check the cluster (kubectl), each finding one line naming the fix:")
        for line in preflight.describe(values, target):
            log(f"  {line}")
        result.notes = rendered.notes
        return result
    if preflight_cluster:
        findings = preflight.run(values, target, kubectl=kubectl, context=kube_context,
                                 kubeconfig=str(config) if config else None)
        if findings:
            raise PreflightFailed(findings)
        log("preflight: the cluster has what the release needs")
    try:
        installed = helm_chart.upgrade_install(values, d.release, d.namespace, chart=chart,
                                               kubeconfig=kubeconfig, kube_context=kube_context,
                                               wait=wait, timeout_s=timeout_s, log=log)
    except helm_chart.ValuesRejected as e:
        raise _rejected(spec, e) from None
    result.notes, result.revision = installed.notes, installed.revision
    return result
