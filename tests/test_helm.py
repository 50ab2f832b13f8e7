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
from tritonkit.helm import chart as helm_chart
from tritonkit.helm import deploy as kit_deploy

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
    "jetson": {"platform": "jetson", "runtimeClassName": "nvidia",
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
    "locust": {"locust": {"enabled": True, "workers": 3}},
    "hpa-queue": {"autoscaling": {"enabled": True, "maxReplicas": 4}},
    "hpa-cpu": {"autoscaling": {"enabled": True, "metric": "cpu"}},
    "cpu-only": {"gpu": {"count": 0}, "server": {"gpuMetrics": False}},
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
    from tritonkit.configs.generate import generate

    root = tmp_path_factory.mktemp("helm")
    (root / "onnx").symlink_to(onnx_dir)
    spec_path = write_spec(root, SPEC)
    repo = root / "repo"
    generate(load_spec(spec_path, repo), repo, target="ngc")
    spec = load_spec(spec_path)
    return kit_deploy.chart_values(spec, repo), repo, kit_deploy._spec_for_tuner(spec)


def case_values(kit, name: str) -> dict:
    over = MATRIX[name]
    if over.get("tuner", {}).get("enabled"):  # what `tritonkit deploy` adds when deploy.tuner is on
        over = merged(over, {"modelRepository": {"spec": kit[2]}})
    if over.get("locust", {}).get("enabled"):
        over = merged(over, {"locust": {"locustfile": kit_deploy.locustfile_text()}})
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
        if d["kind"] != "Deployment":
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
        for c in pod["containers"]:  # init containers cannot have probes
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
        assert t[probe]["httpGet"] == {"path": path, "port": "http"}, probe
    pod = triton(docs)["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m for m in t["volumeMounts"]}
    assert mounts["/tmp"]["name"] in {v["name"] for v in pod["volumes"] if "emptyDir" in v}
    for model in ("mlp", "seq_mean"):
        assert mounts[f"/models/{model}/1"] == {"name": "engines", "mountPath": f"/models/{model}/1",
                                                "subPath": f"{model}/1", "readOnly": True}
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
    name, _, docs = case
    repo = kit[1]
    cm = one(docs, "ConfigMap", "edge-triton-edge-model-configs")
    for model in ("mlp", "seq_mean"):
        assert cm["data"][f"{model}.config.pbtxt"] == (repo / model / "config.pbtxt").read_text()
    t = container(triton(docs), "triton")
    mounts = {m["mountPath"]: m for m in t["volumeMounts"]}
    if name in ("tuner", "everything"):
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
        pvcs = kinds(docs, "PersistentVolumeClaim")
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
    inference = rules[("grpc", "http")]
    if name == "everything":  # allowExternal off: labelled clients and the Locust pods only
        assert {"edge-triton-edge-client"} <= {k for f in inference["from"] for k in f["podSelector"]["matchLabels"]}
        assert any(f["podSelector"]["matchLabels"].get("app.kubernetes.io/component") == "locust"
                   for f in inference["from"])
    else:
        assert "from" not in inference
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == triton(docs)["spec"]["selector"]["matchLabels"]


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
    name, _, docs = case
    names = [c["name"] for c in triton(docs)["spec"]["template"]["spec"]["containers"]]
    if name not in ("tuner", "everything"):
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
    name, _, docs = case
    deployments = {d["metadata"]["name"]: d for d in kinds(docs, "Deployment")}
    if name not in ("locust", "everything"):
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
    assert one(docs, "NetworkPolicy", "edge-triton-edge-locust")["spec"]["policyTypes"] == ["Ingress", "Egress"]


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
    p = tritonkit("deploy", "--dry-run", "--out", "out/deploy", cwd=root, env={"TRITONKIT_API_KEY": sentinel})
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
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    assert cm["data"]["edge_mlp.config.pbtxt"] == (root / "ngc_repo" / "edge_mlp" / "config.pbtxt").read_text()
    assert 'platform: "onnxruntime_onnx"' in cm["data"]["edge_mlp.config.pbtxt"]  # no GPU here


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
