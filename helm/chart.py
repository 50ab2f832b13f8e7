"""The triton-edge Helm chart: find it, render it, check the manifests, install it.

Real Helm does every step: the `helm` binary when it is on PATH, otherwise the Helm library from
helm-python-sdk (no binary needed). Manifests are checked against the Kubernetes JSON schemas of
kubernetes-validate for the oldest supported Kubernetes and the newest one it knows.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from tritonkit.errors import InputError, KitError, Problem
from tritonkit.files import write_bytes_atomic

CHART_NAME = "triton-edge"
MIN_KUBE = "1.28"  # Chart.yaml kubeVersion
# Kinds from CRDs that kubernetes-validate has no schema for; the tests check their shape.
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


class ValuesRejected(KitError):
    """Helm refused the values: the chart's schema or one of its template checks."""


class MissingExtra(KitError):
    """The kit was installed without its `deploy` extra (an edge box needs no Helm): the user fixes
    it by installing the extra, so it exits 2 like any input the user can fix."""

    exit_code = 2


# The packages of the `deploy` extra (pyproject.toml), by the module each one installs.
DEPLOY_EXTRA = {"helm_python": "helm-python-sdk", "kubernetes_validate": "kubernetes-validate",
                "envoy_data_plane": "envoy-data-plane"}


def require_deploy_extra() -> None:
    """Raise MissingExtra, naming the extra and how to install it, when its packages are absent."""
    missing = [dist for module, dist in DEPLOY_EXTRA.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise MissingExtra(f"rendering and installing the chart needs the kit's [deploy] extra ({', '.join(missing)} "
                           "not installed) (fix: pip install 'triton-edge-kit[deploy]', or from a checkout "
                           "pip install -e '.[deploy]')")


def chart_dir() -> Path:
    """The chart shipped with the kit as package data of `tritonkit.helm`: the checkout's
    helm/triton-edge for an editable install, site-packages for a wheel."""
    d = Path(str(importlib.resources.files("tritonkit.helm") / CHART_NAME))
    if not (d / "Chart.yaml").is_file():
        raise KitError(f"the kit's chart is missing from {d} (fix: reinstall triton-edge-kit, or pass --chart)")
    return d


def helm_binary() -> str | None:
    return shutil.which("helm")


def kube_versions() -> tuple[str, str]:
    import kubernetes_validate

    return MIN_KUBE, ".".join(kubernetes_validate.latest_version().split(".")[:2])


@dataclass(frozen=True)
class Manifest:
    source: str  # template path, e.g. triton-edge/templates/deployment.yaml
    doc: dict

    @property
    def kind(self) -> str:
        return self.doc["kind"]

    @property
    def name(self) -> str:
        return self.doc["metadata"]["name"]

    def __str__(self) -> str:
        return f"{self.kind}/{self.name} ({self.source})"


@dataclass
class Rendered:
    manifests: list[Manifest]
    notes: str
    engine: str  # which Helm rendered: "helm-python-sdk <sdk version>" or the binary's path

    def yaml(self) -> str:
        return "".join(f"---\n# Source: {m.source}\n{yaml.safe_dump(m.doc, sort_keys=False)}" for m in self.manifests)


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def _parse(templates: dict[str, str]) -> tuple[list[Manifest], str]:
    out, notes = [], ""
    for source in sorted(templates):
        if source.endswith("NOTES.txt"):
            notes = templates[source].strip()
            continue
        for doc in yaml.safe_load_all(templates[source]):
            if doc:
                out.append(Manifest(source, doc))
    return out, notes


def render(values: dict, release: str, namespace: str, chart: Path | None = None) -> Rendered:
    """Render offline, like `helm template`. Raises ValuesRejected for values Helm refuses."""
    chart = chart or chart_dir()
    binary = helm_binary()
    if binary:
        return _render_binary(binary, values, release, namespace, chart)
    import helm_python as helm

    try:
        with helm.Chart.load(chart) as c:
            templates = c.render(values, name=release, namespace=namespace, is_install=True)
    except (helm.HelmValuesError, helm.HelmRenderError) as e:
        raise ValuesRejected(one_line(e)) from None
    except helm.HelmError as e:
        raise KitError(f"Helm could not render {chart}: {one_line(e)}") from None
    manifests, notes = _parse(templates)
    return Rendered(manifests, notes, f"helm-python-sdk (Helm {helm.helm_sdk_version()})")


def _values_file(values: dict, folder: str) -> str:
    path = Path(folder) / "values.json"  # JSON is YAML, and keeps every string a string
    path.write_text(json.dumps(values))
    return str(path)


def _render_binary(binary: str, values: dict, release: str, namespace: str, chart: Path) -> Rendered:
    with tempfile.TemporaryDirectory() as tmp:
        p = subprocess.run([binary, "template", release, str(chart), "--namespace", namespace,
                            "--values", _values_file(values, tmp)], capture_output=True, text=True)
    if p.returncode != 0:
        raise ValuesRejected(one_line(p.stderr or p.stdout))
    templates: dict[str, str] = {}
    for part in p.stdout.split("\n---\n"):
        lines = part.strip().splitlines()
        src = next((ln.removeprefix("# Source: ") for ln in lines if ln.startswith("# Source: ")), None)
        if src:
            templates[src] = templates.get(src, "") + "\n---\n" + part
    manifests, _ = _parse(templates)
    return Rendered(manifests, "", binary)


def lint(values: dict, chart: Path | None = None, versions: tuple[str, ...] | None = None) -> list[str]:
    """`helm lint --strict` of the chart with these values, for each Kubernetes version: the
    warnings and errors (Helm's library, the same code as the binary's lint)."""
    import helm_python as helm

    problems = []
    for version in versions or kube_versions():
        report = helm.lint(chart or chart_dir(), values, strict=True, kube_version=f"v{version}.0")
        problems += [f"Kubernetes {version}: {m.get('text', m)}" for m in report["messages"] if m["severity"] >= 2]
        problems += [f"Kubernetes {version}: {e}" for e in report["errors"] or []]
    return problems


def validate(rendered: Rendered, versions: tuple[str, ...] | None = None) -> list[str]:
    """Every manifest against the Kubernetes schemas (strict: unknown fields are errors)."""
    import kubernetes_validate as kv

    problems = []
    for version in versions or kube_versions():
        for m in rendered.manifests:
            if (m.doc.get("apiVersion"), m.kind) in CRD_KINDS:
                continue
            try:
                kv.validate(m.doc, version, strict=True)
            except kv.ValidationError as e:
                where = "/".join(str(p) for p in e.absolute_path)
                problems.append(f"{m} at {where or '/'}: {one_line(e.message)} (Kubernetes {version})")
            except kv.SchemaNotFoundError as e:
                problems.append(f"{m}: {e.message}")
    return problems


def write(rendered: Rendered, values: dict, out: Path) -> list[Path]:
    """Write each template's manifests under out/ (as `helm template --output-dir` lays them out),
    all of them in out/manifests.yaml, and the values used in out/values.yaml."""
    out = Path(out)
    stale = out / CHART_NAME
    if stale.is_dir():  # a template switched off since the last run must not linger
        shutil.rmtree(stale)
    written = []
    by_source: dict[str, list[Manifest]] = {}
    for m in rendered.manifests:
        by_source.setdefault(m.source, []).append(m)
    for source, items in by_source.items():
        path = out / source
        text = "".join(f"---\n{yaml.safe_dump(m.doc, sort_keys=False)}" for m in items)
        write_bytes_atomic(path, text.encode())
        written.append(path)
    for name, text in (("manifests.yaml", rendered.yaml()),
                       ("values.yaml", yaml.safe_dump(values, sort_keys=False)),
                       ("NOTES.txt", rendered.notes + "\n")):
        write_bytes_atomic(out / name, text.encode())
        written.append(out / name)
    return written


# -- the cluster -------------------------------------------------------------------------------

_DRY_RUN_FIX = "or render only with `tritonkit deploy --dry-run --out DIR`"


def _no_cluster(detail: str) -> KitError:
    return KitError(f"no Kubernetes cluster to deploy to: {detail} (fix: point KUBECONFIG at your cluster's "
                    f"kubeconfig, e.g. /etc/rancher/k3s/k3s.yaml on k3s or `microk8s config` output, {_DRY_RUN_FIX})")


def unreachable(where: str, detail: str) -> KitError:
    return KitError(f"Kubernetes cluster unreachable through {where}: {detail} (fix: start the cluster, or pick "
                    f"a reachable one with --kube-context/--kubeconfig, {_DRY_RUN_FIX})")


def kubeconfig_path(explicit: Path | None) -> Path | None:
    """The kubeconfig Helm will use; None inside a pod (service account). Raises one clear error
    when there is none, before anything tries to connect."""
    if explicit is not None:
        if not Path(explicit).is_file():
            raise InputError([Problem("command line", "--kubeconfig", f"{explicit} does not exist",
                                      "pass the path of an existing kubeconfig")])
        return Path(explicit)
    env = os.environ.get("KUBECONFIG", "")
    if env:
        found = [Path(p) for p in env.split(os.pathsep) if p and Path(p).is_file()]
        if not found:
            raise _no_cluster(f"KUBECONFIG={env} names no existing file")
        return found[0]
    home = Path.home() / ".kube" / "config"
    if home.is_file():
        return home
    if os.environ.get("KUBERNETES_SERVICE_HOST") and Path(SERVICE_ACCOUNT_TOKEN).exists():
        return None  # inside a pod: Helm uses the service account
    raise _no_cluster("no kubeconfig (KUBECONFIG is unset and ~/.kube/config does not exist)")


@dataclass(frozen=True)
class Installed:
    notes: str  # Helm's NOTES.txt
    revision: int  # the release revision this install or upgrade made (the tune Job's name ends with it)


def upgrade_install(values: dict, release: str, namespace: str, *, chart: Path | None = None,
                    kubeconfig: Path | None = None, kube_context: str | None = None, wait: bool = False,
                    timeout_s: int = 600, log: Callable[[str], None] = print) -> Installed:
    """`helm upgrade --install` into the current (or given) kube context."""
    chart = chart or chart_dir()
    config = kubeconfig_path(kubeconfig)
    where = (f"context {kube_context or '(current)'} of {config}" if config else "the in-cluster service account")
    binary = helm_binary()
    if binary:
        return _install_binary(binary, values, release, namespace, chart, config, kube_context, wait, timeout_s,
                               where, log)
    import helm_python as helm

    try:
        with helm.Config(kubeconfig_path=config, kube_context=kube_context, namespace=namespace) as cfg:
            try:
                cfg.check_reachable()
            except helm.HelmKubeError as e:
                raise unreachable(where, one_line(e)) from None
            opts = {"namespace": namespace, "timeout": timeout_s, "wait": "watcher" if wait else None}
            try:
                cfg.history(release, max_revisions=1)
                exists = True
            except helm.HelmNotFoundError:
                exists = False
            with helm.Chart.load(chart) as c:
                if exists:
                    rel = cfg.upgrade(c, release, values, **opts)
                else:
                    rel = cfg.install(c, release, values, create_namespace=True, **opts)
    except (helm.HelmValuesError, helm.HelmRenderError) as e:
        raise ValuesRejected(one_line(e)) from None
    except helm.HelmKubeError as e:
        raise unreachable(where, one_line(e)) from None
    except helm.HelmError as e:
        raise KitError(f"helm upgrade --install {release} failed: {one_line(e)}") from None
    info = rel.get("info") or {}
    log(f"release {release} revision {rel.get('version', '?')} in namespace {namespace}: "
        f"{info.get('status', 'unknown')}")
    return Installed(str(info.get("notes", "")).strip(), int(rel.get("version") or 0))


def _install_binary(binary, values, release, namespace, chart, config, kube_context, wait, timeout_s, where, log):
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [binary, "upgrade", "--install", release, str(chart), "--namespace", namespace, "--create-namespace",
               "--values", _values_file(values, tmp), "--timeout", f"{timeout_s}s"]
        if config:
            cmd += ["--kubeconfig", str(config)]
        if kube_context:
            cmd += ["--kube-context", kube_context]
        if wait:
            cmd.append("--wait")
        p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        err = one_line(p.stderr or p.stdout)
        if "cluster unreachable" in err.lower() or "connection refused" in err.lower():
            raise unreachable(where, err)
        raise KitError(f"helm upgrade --install {release} failed: {err}")
    log(p.stdout.split("NOTES:")[0].strip())
    notes = p.stdout.split("NOTES:", 1)[1].strip() if "NOTES:" in p.stdout else ""
    revision = re.search(r"^REVISION: (\d+)", p.stdout, re.M)
    return Installed(notes, int(revision[1]) if revision else 0)
