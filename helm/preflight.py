"""Before `helm install`: what the cluster must have for the release to start, read with kubectl.

Each finding is one line that names the fix. A finding that would leave the pod Pending or
crash-looping (no RuntimeClass the pod names, no GPU to give it, an image for another CPU, models
on another machine's disk) stops the deploy with exit 2 before anything is installed.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from dataclasses import dataclass

from tritonkit.errors import KitError
from tritonkit.helm.chart import one_line, unreachable
from tritonkit.support import Target

GPU_DRIVER_LABEL = "nvidia.com/cuda.driver.major"  # set by NVIDIA's GPU feature discovery


@dataclass(frozen=True)
class Check:
    what: str  # what is checked, for --dry-run
    command: tuple[str, ...]  # the kubectl arguments that read it


def checks(values: dict) -> list[Check]:
    """What preflight reads for these chart values."""
    out = [Check("the nodes: their CPU architecture, allocatable GPUs and labels", ("get", "nodes", "-o", "json"))]
    if values.get("runtimeClassName"):
        out.append(Check(f"the RuntimeClass {values['runtimeClassName']!r} the pod names",
                         ("get", "runtimeclass", "-o", "json")))
    elif values.get("gpu", {}).get("count", 0):
        out.append(Check("whether a RuntimeClass 'nvidia' exists that the pod should name (k3s)",
                         ("get", "runtimeclass", "-o", "json")))
    return out


def describe(values: dict, target: Target) -> list[str]:
    lines = [f"kubectl {' '.join(c.command)}: {c.what}" for c in checks(values)]
    if values.get("gpu", {}).get("count", 0):
        lines.append(f"some node matching nodeSelector offers {values['gpu']['count']} {_gpu_resource(values)}")
    lines.append(f"some such node is {target.arch} (deploy.platform {target.platform}; the images are "
                 f"{', '.join(target.image_arches)})")
    if target.release.min_driver and target.platform != "jetson":  # JetPack carries Jetson's driver
        lines.append(f"its NVIDIA driver is {target.release.min_driver} or newer (label {GPU_DRIVER_LABEL})")
    if values.get("engines", {}).get("source") == "hostPath":
        lines.append("the hostPath engines are on the node: this machine is that node")
    return lines


def _gpu_resource(values: dict) -> str:
    return values.get("gpu", {}).get("resourceName") or "nvidia.com/gpu"


def _kubectl(kubectl: str, args: tuple[str, ...], context: str | None, kubeconfig: str | None) -> dict:
    cmd = [kubectl, *(["--kubeconfig", kubeconfig] if kubeconfig else []),
           *(["--context", context] if context else []), *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise KitError(f"preflight: {' '.join(cmd[:1] + list(args))} failed: {e}") from None
    if done.returncode != 0:
        err = one_line(done.stderr or done.stdout)
        if any(s in err.lower() for s in ("connection refused", "unreachable", "no such host", "i/o timeout")):
            raise unreachable(f"context {context or '(current)'} of {kubeconfig or 'the in-cluster service account'}",
                              err[-300:])
        raise KitError(f"preflight: kubectl {' '.join(args)} failed: {err[-300:]} "
                       "(fix: a kube context that reaches the cluster, or --no-preflight)")
    return json.loads(done.stdout or "{}")


def run(values: dict, target: Target, *, kubectl: str | None = None, context: str | None = None,
        kubeconfig: str | None = None) -> list[str]:
    """The findings (empty: nothing stops the install)."""
    kubectl = kubectl or shutil.which("kubectl")
    if not kubectl:
        return ["kubectl is not on PATH, so the cluster was not checked: install kubectl, or pass --no-preflight"]
    nodes = _kubectl(kubectl, ("get", "nodes", "-o", "json"), context, kubeconfig).get("items", [])
    selector = values.get("nodeSelector") or {}
    fit = [n for n in nodes if all(n["metadata"].get("labels", {}).get(k) == v for k, v in selector.items())]
    findings = []
    if not fit:
        findings.append(f"no node matches nodeSelector {selector}: label the GPU node "
                        f"(kubectl label node <node> {' '.join(f'{k}={v}' for k, v in selector.items())}) "
                        "or change deploy.node_selector")
        return findings
    gpus, resource = int(values.get("gpu", {}).get("count", 0)), _gpu_resource(values)
    if gpus:
        with_gpu = [n for n in fit if int(n["status"].get("allocatable", {}).get(resource, "0")) >= gpus]
        if not with_gpu:
            findings.append(f"no node offers {gpus} {resource} (allocatable): install the NVIDIA device plugin "
                            "(on k3s: the NVIDIA container toolkit, then the device plugin's DaemonSet with "
                            "runtimeClassName nvidia), or set deploy.gpus: 0 to serve on the CPU")
        else:
            fit = with_gpu
    arches = sorted({n["status"].get("nodeInfo", {}).get("architecture", "?") for n in fit})
    if target.arch not in arches:  # the platform names the node's CPU (and which images serve it)
        findings.append(f"the nodes are {', '.join(arches)}, deploy.platform {target.platform} is {target.arch} "
                        f"(images {target.server_image}: {', '.join(target.image_arches)}): set deploy.platform "
                        f"to the node's ({'x86' if 'amd64' in arches else 'sbsa or jetson'})")
    drivers = [int(v) for n in fit if (v := n["metadata"].get("labels", {}).get(GPU_DRIVER_LABEL, "")).isdigit()]
    needs = target.release.min_driver if target.platform != "jetson" else None  # JetPack carries Jetson's
    if gpus and needs and drivers and max(drivers) < needs:
        findings.append(f"the node's NVIDIA driver is {max(drivers)}, NGC {target.release.release} needs "
                        f"{target.release.min_driver}: update the driver or pick an older deploy.triton_version")
    runtime_class = values.get("runtimeClassName")
    if runtime_class:
        names = [r["metadata"]["name"] for r in
                 _kubectl(kubectl, ("get", "runtimeclass", "-o", "json"), context, kubeconfig).get("items", [])]
        if runtime_class not in names:
            have = ", ".join(names) or "none"
            findings.append(f"no RuntimeClass {runtime_class!r} (the cluster has: {have}): on k3s "
                            "install the NVIDIA container toolkit and restart k3s, which then registers it; "
                            "or set deploy.runtime_class")
    elif gpus:
        names = [r["metadata"]["name"] for r in
                 _kubectl(kubectl, ("get", "runtimeclass", "-o", "json"), context, kubeconfig).get("items", [])]
        if "nvidia" in names:
            findings.append("the cluster has a RuntimeClass 'nvidia' and the pod names none: on k3s the GPU is "
                            "visible only through it; set deploy.runtime_class: nvidia")
    if values.get("engines", {}).get("source") == "hostPath":
        here = socket.gethostname()
        if here not in {n["metadata"]["name"] for n in fit}:
            findings.append(f"engines.source hostPath reads {values['engines']['hostPath']['path']} on the node, and "
                            f"this machine ({here}) is not a node: set deploy.engines.source: fetch with a URL "
                            "(deploy writes and uploads the archive; docs/deploying.md)")
    return findings
